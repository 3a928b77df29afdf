//! Paired geometric ratios and paired-log Student-t intervals (seed 000 §5.3).
//!
//! For pairs (a_i, b_i) of positive measurements the per-pair ratio is r_i = b_i / a_i and the
//! analysis is done on d_i = ln r_i: the overall ratio is exp(mean d), and the interval at
//! `level` is exp(mean d ± t_{(1+level)/2, n−1} · sd(d) / √n), sd with n − 1 in the
//! denominator. The interval quantifies repetition at one fixed identity, nothing wider.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::path::Path;

/// One pair: its two operands and their ratio b / a.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PairRatio {
    pub label: String,
    pub a: f64,
    pub b: f64,
    pub ratio: f64,
    pub log_ratio: f64,
}

/// The overall paired result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PairedRatio {
    pub n: usize,
    pub level: f64,
    /// Degrees of freedom, n − 1.
    pub df: usize,
    pub pairs: Vec<PairRatio>,
    pub mean_log: f64,
    /// Sample standard deviation of the log ratios (None for one pair).
    pub sd_log: Option<f64>,
    /// The Student-t quantile used (None for one pair).
    pub t: Option<f64>,
    /// Geometric mean of b / a.
    pub ratio: f64,
    /// Interval bounds on the ratio scale (None for one pair: no variance estimate).
    pub lo: Option<f64>,
    pub hi: Option<f64>,
}

/// The paired geometric ratio b/a with its paired-log t interval; labels name the pairs.
pub fn paired_ratio(labels: &[String], a: &[f64], b: &[f64], level: f64) -> Result<PairedRatio> {
    if a.len() != b.len() || labels.len() != a.len() {
        bail!("paired data needs as many b values as a values ({} vs {})", a.len(), b.len());
    }
    if a.is_empty() {
        bail!("no pairs");
    }
    if !(level > 0.0 && level < 1.0) {
        bail!("level must lie strictly between 0 and 1 (got {level})");
    }
    let mut pairs = Vec::with_capacity(a.len());
    for ((label, &x), &y) in labels.iter().zip(a).zip(b) {
        if !(x.is_finite() && y.is_finite() && x > 0.0 && y > 0.0) {
            bail!("pair {label}: both values must be positive and finite for a log ratio (a = {x}, b = {y})");
        }
        let ratio = y / x;
        pairs.push(PairRatio { label: label.clone(), a: x, b: y, ratio, log_ratio: ratio.ln() });
    }
    let n = pairs.len();
    let mean_log = pairs.iter().map(|p| p.log_ratio).sum::<f64>() / n as f64;
    let ratio = mean_log.exp();
    let (sd_log, t, lo, hi) = if n >= 2 {
        let var = pairs.iter().map(|p| (p.log_ratio - mean_log).powi(2)).sum::<f64>() / (n - 1) as f64;
        let sd = var.sqrt();
        let dist = StudentsT::new(0.0, 1.0, (n - 1) as f64).context("Student-t distribution")?;
        let t = dist.inverse_cdf(0.5 + level / 2.0);
        let half = t * sd / (n as f64).sqrt();
        (Some(sd), Some(t), Some((mean_log - half).exp()), Some((mean_log + half).exp()))
    } else {
        (None, None, None, None)
    };
    Ok(PairedRatio { n, level, df: n - 1, pairs, mean_log, sd_log, t, ratio, lo, hi })
}

/// Reads columns `col_a` and `col_b` of a CSV file with a header row (numbers; surrounding
/// blanks ignored) and labels each pair by its 1-based row number.
pub fn read_pairs_csv(path: &Path, col_a: &str, col_b: &str) -> Result<(Vec<String>, Vec<f64>, Vec<f64>)> {
    let mut rd =
        csv::ReaderBuilder::new().trim(csv::Trim::All).from_path(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let headers = rd.headers().with_context(|| format!("{}: no header row", path.display()))?.clone();
    let find = |c: &str| {
        headers
            .iter()
            .position(|h| h == c)
            .with_context(|| format!("{}: no column {c:?} (columns: {})", path.display(), headers.iter().collect::<Vec<_>>().join(", ")))
    };
    let (ia, ib) = (find(col_a)?, find(col_b)?);
    let (mut labels, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for (i, row) in rd.records().enumerate() {
        let row = row.with_context(|| format!("{}: row {}", path.display(), i + 1))?;
        let num = |idx: usize, col: &str| -> Result<f64> {
            let s = row.get(idx).unwrap_or("");
            s.parse::<f64>().with_context(|| format!("{}: row {}, column {col}: {s:?} is not a number", path.display(), i + 1))
        };
        a.push(num(ia, col_a)?);
        b.push(num(ib, col_b)?);
        labels.push((i + 1).to_string());
    }
    Ok((labels, a, b))
}

/// Refuses rows whose two columns come from different nodes: a column's node, when the table
/// has it, is in `<COL>_node` (as `export` writes `a_node` / `b_node` in pairs.csv). A table
/// without those columns says nothing about nodes and is not refused.
pub fn check_pair_nodes(path: &Path, col_a: &str, col_b: &str) -> Result<()> {
    let mut rd =
        csv::ReaderBuilder::new().trim(csv::Trim::All).from_path(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let headers = rd.headers().with_context(|| format!("{}: no header row", path.display()))?.clone();
    let find = |c: &str| headers.iter().position(|h| h == format!("{c}_node"));
    let (Some(ia), Some(ib)) = (find(col_a), find(col_b)) else { return Ok(()) };
    for (i, row) in rd.records().enumerate() {
        let row = row.with_context(|| format!("{}: row {}", path.display(), i + 1))?;
        let (na, nb) = (row.get(ia).unwrap_or(""), row.get(ib).unwrap_or(""));
        if na != nb {
            bail!(
                "{}: row {}: {col_a} and {col_b} ran on different nodes ({:?} and {:?}); --allow-mixed-nodes pairs them anyway",
                path.display(),
                i + 1,
                &na[..12.min(na.len())],
                &nb[..12.min(nb.len())]
            );
        }
    }
    Ok(())
}

impl PairedRatio {
    /// A table of the pairs and the overall line, for people.
    pub fn to_text(&self, a: &str, b: &str) -> String {
        let mut s = format!("{:>6} {:>14} {:>14} {:>10}\n", "pair", a, b, format!("{b}/{a}"));
        for p in &self.pairs {
            s += &format!("{:>6} {:>14} {:>14} {:>10.6}\n", p.label, p.a, p.b, p.ratio);
        }
        match (self.lo, self.hi) {
            (Some(lo), Some(hi)) => {
                s += &format!(
                    "paired geometric ratio {b}/{a} = {:.6}, {}% paired-log t interval [{lo:.6}, {hi:.6}] (n = {}, df = {})\n",
                    self.ratio,
                    self.level * 100.0,
                    self.n,
                    self.df
                )
            }
            _ => s += &format!("paired geometric ratio {b}/{a} = {:.6} (n = {}: no interval)\n", self.ratio, self.n),
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 000, Table 6: the six matched D/F complete-wall pairs.
    const D: [f64; 6] = [102.358, 102.228, 100.032, 101.996, 102.202, 101.616];
    const F: [f64; 6] = [32.867, 32.820, 32.837, 32.889, 32.887, 32.811];

    #[test]
    fn table6_paired_f_over_d() {
        let labels: Vec<String> = (1..=6).map(|i| i.to_string()).collect();
        let r = paired_ratio(&labels, &D, &F, 0.95).unwrap();
        assert_eq!(r.df, 5);
        assert_eq!(format!("{:.4}", r.ratio), "0.3229");
        assert_eq!(format!("{:.4}", r.lo.unwrap()), "0.3201");
        assert_eq!(format!("{:.4}", r.hi.unwrap()), "0.3258");
        // The published per-pair ratios (six decimals).
        let published = [0.321095, 0.321052, 0.328269, 0.322449, 0.321784, 0.322888];
        for (p, want) in r.pairs.iter().zip(published) {
            // The published ratios were taken before the times were rounded to milliseconds.
            assert!((p.ratio - want).abs() < 1e-5, "{} vs {want}", p.ratio);
        }
        // t_{0.975, 5}.
        assert!((r.t.unwrap() - 2.570582).abs() < 1e-6);
    }

    #[test]
    fn degenerate_inputs() {
        let l = vec!["1".to_string()];
        let one = paired_ratio(&l, &[2.0], &[1.0], 0.95).unwrap();
        assert_eq!(one.ratio, 0.5);
        assert!(one.lo.is_none());
        assert!(paired_ratio(&l, &[0.0], &[1.0], 0.95).is_err());
        assert!(paired_ratio(&l, &[1.0], &[1.0], 1.0).is_err());
        assert!(paired_ratio(&[], &[], &[], 0.95).is_err());
    }
}
