//! Task scoring of a response against its expected answers, by SQuAD v2.0's evaluation rules:
//! both sides normalised (lower case, ASCII punctuation removed, the articles `a`, `an`, `the`
//! removed as whole words, whitespace collapsed), exact match of the normalised strings, and F1
//! over their whitespace tokens as multisets; against several answers, the best of each.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One response's scores against its expected answers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// 1.0 where the normalised response equals a normalised answer, else 0.0.
    pub exact_match: f64,
    /// The best token-level F1 over the answers, in [0, 1].
    pub f1: f64,
}

/// The mean scores of the responses that had expected answers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub scored: u64,
    pub exact_match: f64,
    pub f1: f64,
}

/// Scores `response` against `answers`; `None` where there is no answer to score against.
pub fn score(response: &str, answers: &[String]) -> Option<Score> {
    let response = normalize(response);
    let best =
        |f: &dyn Fn(&str) -> f64| answers.iter().map(|a| f(&normalize(a))).fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    Some(Score { exact_match: best(&|a| if a == response { 1.0 } else { 0.0 })?, f1: best(&|a| f1(&response, a))? })
}

/// The mean of the scores present; `None` where none is.
pub fn aggregate<'a>(scores: impl IntoIterator<Item = &'a Option<Score>>) -> Option<Aggregate> {
    let scored: Vec<&Score> = scores.into_iter().flatten().collect();
    if scored.is_empty() {
        return None;
    }
    let n = scored.len() as f64;
    Some(Aggregate {
        scored: scored.len() as u64,
        exact_match: scored.iter().map(|s| s.exact_match).sum::<f64>() / n,
        f1: scored.iter().map(|s| s.f1).sum::<f64>() / n,
    })
}

/// SQuAD's `normalize_answer`: lower case, no ASCII punctuation, no articles, single spaces.
pub fn normalize(s: &str) -> String {
    let lower: String = s.to_lowercase().chars().filter(|c| !c.is_ascii_punctuation()).collect();
    // Articles are whole words: runs of word characters (`\w`) equal to one, between non-word ones.
    let mut out = String::with_capacity(lower.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if matches!(word.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in lower.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Token F1 of two normalised strings; where either has no token, 1.0 if both have none.
fn f1(prediction: &str, answer: &str) -> f64 {
    let (p, g): (Vec<&str>, Vec<&str>) = (prediction.split_whitespace().collect(), answer.split_whitespace().collect());
    if p.is_empty() || g.is_empty() {
        return if p == g { 1.0 } else { 0.0 };
    }
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for t in &g {
        *counts.entry(t).or_default() += 1;
    }
    let mut same = 0u64;
    for t in &p {
        if let Some(c) = counts.get_mut(t).filter(|c| **c > 0) {
            *c -= 1;
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let (precision, recall) = (same as f64 / p.len() as f64, same as f64 / g.len() as f64);
    2.0 * precision * recall / (precision + recall)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn normalisation_is_squads() {
        assert_eq!(normalize("  The Quick, brown FOX!  "), "quick brown fox");
        // Articles go only as whole words; punctuation goes first, so "the-end" is one word.
        assert_eq!(normalize("Theory of an ant, a1 and the-end"), "theory of ant a1 and theend");
        // A non-ASCII symbol is not punctuation to SQuAD, but it ends a word.
        assert_eq!(normalize("the—end"), "—end");
        assert_eq!(normalize("Ünïcode ÉTÉ"), "ünïcode été");
        assert_eq!(normalize("a an the"), "");
        // `_` is ASCII punctuation: it goes before the articles are looked for.
        assert_eq!(normalize("x_the the_x the"), "xthe thex");
    }

    #[test]
    fn exact_match_and_f1_take_the_best_answer() {
        let s = score("The Eiffel Tower.", &answers(&["eiffel tower", "tour eiffel"])).unwrap();
        assert_eq!(s, Score { exact_match: 1.0, f1: 1.0 });
        // "in paris france" against "paris": precision 1/3, recall 1, F1 0.5.
        let s = score("in Paris, France", &answers(&["Paris"])).unwrap();
        assert_eq!((s.exact_match, s.f1), (0.0, 0.5));
        // Tokens count as multisets: two of three tokens shared each way.
        let s = score("x x y", &answers(&["x y y"])).unwrap();
        assert_eq!(s.f1, 2.0 / 3.0);
        assert_eq!(score("nothing shared", &answers(&["else"])).unwrap().f1, 0.0);
        // Both empty after normalisation: a match; one empty: none.
        assert_eq!(score("The", &answers(&["a"])).unwrap(), Score { exact_match: 1.0, f1: 1.0 });
        assert_eq!(score("", &answers(&["x"])).unwrap(), Score { exact_match: 0.0, f1: 0.0 });
        assert_eq!(score("x", &[]), None);
    }

    #[test]
    fn the_aggregate_is_the_mean_over_scored_responses() {
        let scores = [Some(Score { exact_match: 1.0, f1: 1.0 }), None, Some(Score { exact_match: 0.0, f1: 0.5 })];
        assert_eq!(aggregate(&scores), Some(Aggregate { scored: 2, exact_match: 0.5, f1: 0.75 }));
        assert_eq!(aggregate(&[None, None]), None);
    }
}
