//! GGUF fuzz target: bounded, seeded mutations of one real forged model at the places the format
//! gives meaning to (metadata values and types, array counts, tensor dims/types/offsets, header
//! counts), plus raw byte flips and truncations. Each mutated file goes through `inventory` and, if
//! accepted, `generate`; the binary must never die by signal, hang, exit outside 0/1/2, say more
//! than one line when it refuses, or leave `DIR.partial` behind.

use crate::common;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use sovereign::gguf::{GgmlType, Gguf, GgufWriter, TensorSpec, Value};

const SEED: [u8; 32] = *b"sovereign gguf fuzz, fixed seed!";
const CASES: u32 = 150;
const TIMEOUT: Duration = Duration::from_secs(20);

/// A place in the file the format gives meaning to, found by walking the header.
#[derive(Debug, Clone)]
enum Field {
    /// A scalar metadata value: key, type id, offset of the type id, offset and width of the value.
    Scalar {
        key: String,
        ty: u32,
        ty_off: usize,
        off: usize,
        width: usize,
    },
    /// A string metadata value or array: the length/count field.
    Count {
        key: String,
        ty_off: usize,
        off: usize,
    },
    /// A string element of an array: offset of its length field, its bytes.
    Elem {
        key: String,
        index: u64,
        len_off: usize,
        len: usize,
    },
    TensorDims {
        name: String,
        ndims_off: usize,
        dims: Vec<usize>,
    },
    TensorType {
        name: String,
        off: usize,
    },
    TensorOffset {
        name: String,
        off: usize,
    },
}

struct Layout {
    fields: Vec<Field>,
    /// Offsets of the header's tensor and metadata counts.
    counts: [usize; 2],
    /// End of the tensor directory.
    header_end: usize,
}

fn rd_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn rd_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}
fn scalar_width(ty: u32) -> Option<usize> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}
fn read_str(b: &[u8], o: &mut usize) -> String {
    let n = rd_u64(b, *o) as usize;
    let s = String::from_utf8_lossy(&b[*o + 8..*o + 8 + n]).into_owned();
    *o += 8 + n;
    s
}

/// Walks the header of a well-formed file; checked against the crate's own reader below.
fn layout(b: &[u8]) -> Layout {
    let n_tensors = rd_u64(b, 8);
    let n_kv = rd_u64(b, 16);
    let mut o = 24;
    let mut fields = Vec::new();
    for _ in 0..n_kv {
        let key = read_str(b, &mut o);
        let ty_off = o;
        let ty = rd_u32(b, o);
        o += 4;
        if let Some(w) = scalar_width(ty) {
            fields.push(Field::Scalar { key, ty, ty_off, off: o, width: w });
            o += w;
        } else if ty == 8 {
            fields.push(Field::Count { key, ty_off, off: o });
            read_str(b, &mut o);
        } else {
            assert_eq!(ty, 9, "metadata `{key}` has type {ty}");
            let ety = rd_u32(b, o);
            let n = rd_u64(b, o + 4);
            fields.push(Field::Count { key: key.clone(), ty_off, off: o + 4 });
            o += 12;
            for index in 0..n {
                if ety == 8 {
                    let len_off = o;
                    let len = rd_u64(b, o) as usize;
                    if index < 8 || index + 2 >= n {
                        fields.push(Field::Elem { key: key.clone(), index, len_off, len });
                    }
                    o += 8 + len;
                } else {
                    o += scalar_width(ety).expect("nested arrays are not forged");
                }
            }
        }
    }
    for _ in 0..n_tensors {
        let name = read_str(b, &mut o);
        let ndims_off = o;
        let nd = rd_u32(b, o) as usize;
        o += 4;
        let dims = (0..nd).map(|i| o + 8 * i).collect();
        o += 8 * nd;
        fields.push(Field::TensorDims { name: name.clone(), ndims_off, dims });
        fields.push(Field::TensorType { name: name.clone(), off: o });
        fields.push(Field::TensorOffset { name, off: o + 4 });
        o += 12;
    }
    Layout { fields, counts: [8, 16], header_end: o }
}

fn put(b: &mut [u8], off: usize, width: usize, v: u64) {
    b[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

/// Integer values that break assumptions: 0, 1, small powers, and each width's maximum.
const HOSTILE: [u64; 8] = [0, 1, 2, 16, u32::MAX as u64, u64::MAX, i64::MAX as u64, 1 << 40];

/// Applies mutation `kind` chosen by `a`/`b`; returns its description and the new bytes.
fn mutate(orig: &[u8], lay: &Layout, kind: u8, a: u64, b: u64) -> (String, Vec<u8>) {
    let mut m = orig.to_vec();
    let hostile = HOSTILE[(b % HOSTILE.len() as u64) as usize];
    let pick = |pred: &dyn Fn(&Field) -> bool| -> Field {
        let c: Vec<&Field> = lay.fields.iter().filter(|f| pred(f)).collect();
        c[(a % c.len() as u64) as usize].clone()
    };
    let desc = match kind {
        // A scalar metadata value set to a hostile integer, or a float to NaN/inf/0/-1.
        0..=2 => match pick(&|f| matches!(f, Field::Scalar { .. })) {
            Field::Scalar { key, ty, off, width, .. } if ty == 6 || ty == 12 => {
                let vals = [f64::NAN, f64::INFINITY, 0.0, -1.0, 1e30];
                let v = vals[(b % vals.len() as u64) as usize];
                let bits = if ty == 6 { (v as f32).to_bits() as u64 } else { v.to_bits() };
                put(&mut m, off, width, bits);
                format!("metadata `{key}` = {v}")
            }
            Field::Scalar { key, off, width, .. } => {
                put(&mut m, off, width, hostile);
                format!("metadata `{key}` = {hostile} (width {width})")
            }
            _ => unreachable!(),
        },
        // A metadata value's type id changed.
        3 => {
            let f = pick(&|f| matches!(f, Field::Scalar { .. } | Field::Count { .. }));
            let (key, ty_off) = match f {
                Field::Scalar { key, ty_off, .. } | Field::Count { key, ty_off, .. } => (key, ty_off),
                _ => unreachable!(),
            };
            let ty = [0u64, 4, 5, 6, 8, 9, 10, 12, 13, u32::MAX as u64][(b % 10) as usize];
            put(&mut m, ty_off, 4, ty);
            format!("metadata `{key}` type id = {ty}")
        }
        // A string length or array count set to a hostile value.
        4 => match pick(&|f| matches!(f, Field::Count { .. })) {
            Field::Count { key, off, .. } => {
                put(&mut m, off, 8, hostile);
                format!("metadata `{key}` length/count = {hostile}")
            }
            _ => unreachable!(),
        },
        // A token string made equal to its neighbour, emptied, or its length made hostile.
        5 => match pick(&|f| matches!(f, Field::Elem { .. })) {
            Field::Elem { key, index, len_off, len } => match b % 3 {
                0 if len > 0 => {
                    m[len_off + 8] = m[len_off + 8].wrapping_add(1);
                    format!("`{key}`[{index}] first byte changed")
                }
                1 => {
                    put(&mut m, len_off, 8, hostile);
                    format!("`{key}`[{index}] length = {hostile}")
                }
                _ => {
                    // Overwrite with the previous element's bytes when the lengths agree.
                    let prev = lay.fields.iter().find_map(|f| match f {
                        Field::Elem { key: k, index: i, len_off: p, len: l } if *k == key && *i + 1 == index && *l == len => Some(*p),
                        _ => None,
                    });
                    match prev {
                        Some(p) => {
                            let src = orig[p + 8..p + 8 + len].to_vec();
                            m[len_off + 8..len_off + 8 + len].copy_from_slice(&src);
                            format!("`{key}`[{index}] duplicates [{}]", index - 1)
                        }
                        None => {
                            put(&mut m, len_off, 8, 0);
                            format!("`{key}`[{index}] length = 0")
                        }
                    }
                }
            },
            _ => unreachable!(),
        },
        // A tensor dimension or dimension count changed.
        6 | 7 => match pick(&|f| matches!(f, Field::TensorDims { .. })) {
            Field::TensorDims { name, ndims_off, dims } => {
                if b.is_multiple_of(5) {
                    let nd = [0u64, 1, 5, u32::MAX as u64][(b / 5 % 4) as usize];
                    put(&mut m, ndims_off, 4, nd);
                    format!("tensor `{name}` n_dims = {nd}")
                } else {
                    let d = dims[(b / 5) as usize % dims.len()];
                    let old = rd_u64(orig, d);
                    let v = [hostile, old + 1, old * 2, old / 2, old.saturating_sub(1)][(b / 7 % 5) as usize];
                    put(&mut m, d, 8, v);
                    format!("tensor `{name}` dim @{d} {old} -> {v}")
                }
            }
            _ => unreachable!(),
        },
        // A tensor's type changed (to I32, F16, BF16, a quant, or unknown).
        8 => match pick(&|f| matches!(f, Field::TensorType { .. })) {
            Field::TensorType { name, off } => {
                let t = [0u64, 1, 2, 8, 12, 24, 26, 27, 28, 30, 39, u32::MAX as u64][(b % 12) as usize];
                put(&mut m, off, 4, t);
                format!("tensor `{name}` type = {t}")
            }
            _ => unreachable!(),
        },
        // A tensor's data offset changed.
        9 => match pick(&|f| matches!(f, Field::TensorOffset { .. })) {
            Field::TensorOffset { name, off } => {
                let old = rd_u64(orig, off);
                let v = [0, old + 32, old.wrapping_sub(32), orig.len() as u64, u64::MAX, hostile][(b % 6) as usize];
                put(&mut m, off, 8, v);
                format!("tensor `{name}` offset {old} -> {v}")
            }
            _ => unreachable!(),
        },
        // The header's tensor or metadata count.
        10 => {
            let off = lay.counts[(a % 2) as usize];
            let old = rd_u64(orig, off);
            let v = [hostile, old + 1, old - 1][(a / 2 % 3) as usize];
            put(&mut m, off, 8, v);
            format!("header count @{off} {old} -> {v}")
        }
        // Raw byte flips in the header.
        11 => {
            let n = 1 + (b % 4) as usize;
            let mut s = String::from("flip bytes");
            for i in 0..n {
                let at = ((a >> (i * 16)) as usize ^ (b as usize >> 8)) % lay.header_end;
                let x = 1u8 << ((b >> (i * 3)) % 8);
                m[at] ^= x;
                s += &format!(" @{at}^{x:#x}");
            }
            s
        }
        // Raw byte flips anywhere (tensor data included).
        12 => {
            let at = (a % m.len() as u64) as usize;
            m[at] = (b & 0xff) as u8;
            format!("byte @{at} = {:#x}", b & 0xff)
        }
        // Truncation: mostly inside the header, sometimes inside the data.
        _ => {
            let at = if b.is_multiple_of(3) { (a % m.len() as u64) as usize } else { (a % lay.header_end as u64) as usize };
            m.truncate(at);
            format!("truncated to {at} bytes")
        }
    };
    (desc, m)
}

struct Exit {
    code: Option<i32>,
    signal: Option<i32>,
    stderr: String,
}

/// Runs the binary with a wall-clock bound; output goes to files so a chatty child cannot block.
fn run_bounded(dir: &Path, args: &[&str]) -> Result<Exit, String> {
    let out = std::fs::File::create(dir.join("stdout")).unwrap();
    let err = std::fs::File::create(dir.join("stderr")).unwrap();
    let mut child = common::Reaped::new(
        Command::new(env!("CARGO_BIN_EXE_sovereign"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn sovereign"),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TIMEOUT {
            child.kill().ok();
            child.wait().ok();
            return Err(format!("{args:?} still running after {TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    use std::os::unix::process::ExitStatusExt;
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    Ok(Exit { code: status.code(), signal: status.signal(), stderr })
}

/// Whether the file was refused (false) or accepted (true); any other outcome is an error.
fn judge(what: &str, names: &[&Path], e: &Exit) -> Result<bool, String> {
    if let Some(s) = e.signal {
        return Err(format!("{what}: killed by signal {s}: {}", e.stderr));
    }
    let code = e.code.unwrap();
    if !matches!(code, 0..=2) {
        return Err(format!("{what}: exit {code}: {}", e.stderr));
    }
    if code == 0 {
        return Ok(true);
    }
    let lines: Vec<&str> = e.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() != 1 || e.stderr.contains("panicked") {
        return Err(format!("{what}: exit {code} with {} lines: {}", lines.len(), e.stderr));
    }
    if !names.iter().any(|n| lines[0].contains(n.to_str().unwrap())) {
        return Err(format!("{what}: the error names none of {names:?}: {}", lines[0]));
    }
    Ok(false)
}

#[derive(Debug, PartialEq)]
enum Verdict {
    RefusedByInventory,
    RefusedByGenerate,
    Ran,
    /// llama.cpp aborted (or crashed) in the worker; the run failed closed on record.
    DiedInEngine,
}

/// Puts one mutated file through `inventory` and, if accepted, `generate`.
fn exercise(dir: &Path, n: usize, bytes: &[u8]) -> Result<Verdict, String> {
    let file = dir.join(format!("case{n}.gguf"));
    std::fs::write(&file, bytes).unwrap();
    let f = file.to_str().unwrap();
    let result = (|| {
        let inv = run_bounded(dir, &["inventory", f])?;
        if !judge("inventory", &[&file], &inv)? {
            return Ok(Verdict::RefusedByInventory);
        }
        let rec = dir.join(format!("rec{n}"));
        let r = rec.to_str().unwrap();
        let g = run_bounded(dir, &["generate", "--model", f, "--prompt", "hi", "--n-predict", "2", "--threads", "1", "--record", r])?;
        // A refusal names the file; a run that fails closed names its record.
        let accepted = judge("generate", &[&file, &rec], &g)?;
        let partial = PathBuf::from(format!("{r}.partial"));
        if partial.exists() {
            return Err(format!("generate left {} behind", partial.display()));
        }
        // The engine died in the worker: one line, and a failed record saying so.
        let died = !accepted && g.stderr.contains("killed by signal");
        if died {
            let text = std::fs::read_to_string(rec.join("record.json")).map_err(|e| format!("a dead worker left no failed record: {e}"))?;
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            if v["outcome"] != "failed" {
                return Err(format!("a dead worker's record says {}", v["outcome"]));
            }
        }
        std::fs::remove_dir_all(&rec).ok();
        Ok(match (accepted, died) {
            (true, _) => Verdict::Ran,
            (false, true) => Verdict::DiedInEngine,
            (false, false) => Verdict::RefusedByGenerate,
        })
    })();
    std::fs::remove_file(&file).ok();
    result
}

fn forge_once(dir: &Path, arch: &str) -> (Vec<u8>, Layout) {
    let model = common::forge(dir, &format!("base-{arch}.gguf"), 1, &["--arch", arch]);
    let bytes = std::fs::read(&model).unwrap();
    let lay = layout(&bytes);
    // The walk must agree with the crate's reader: same keys, same tensors, same header end.
    let g = sovereign::gguf::Gguf::open(&model).unwrap();
    let keys: std::collections::BTreeSet<&str> = lay
        .fields
        .iter()
        .filter_map(|f| match f {
            Field::Scalar { key, .. } | Field::Count { key, .. } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(keys, g.metadata.keys().map(|k| k.as_str()).collect());
    let names: Vec<&str> = lay
        .fields
        .iter()
        .filter_map(|f| match f {
            Field::TensorType { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(names, g.tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>());
    assert_eq!((lay.header_end as u64).div_ceil(g.alignment) * g.alignment, g.data_offset);
    (bytes, lay)
}

#[test]
fn gguf_mutations_are_refused_or_run_never_crash() {
    fuzz("qwen3moe", CASES);
}

/// A hybrid family: DeltaNet layers, gated attention, a shared expert.
#[test]
fn gguf_mutations_of_a_hybrid_family_are_refused_or_run_never_crash() {
    fuzz("qwen3next", CASES * 2 / 3);
}

fn fuzz(arch: &str, default_cases: u32) {
    let dir = tempfile::tempdir().unwrap();
    let (orig, lay) = forge_once(dir.path(), arch);
    // The unmutated file runs: a fuzz target that refuses everything proves nothing.
    assert_eq!(exercise(dir.path(), 0, &orig), Ok(Verdict::Ran));

    // GGUF_FUZZ_CASES / GGUF_FUZZ_SEED widen a local search; `make test` runs the fixed default.
    let cases = std::env::var("GGUF_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    let mut seed = SEED;
    if let Some(s) = std::env::var("GGUF_FUZZ_SEED").ok().and_then(|v| v.parse::<u64>().ok()) {
        seed[..8].copy_from_slice(&s.to_le_bytes());
    }
    let config = Config { cases, max_shrink_iters: 16, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let n = Cell::new(0usize);
    let tally = Cell::new([0usize; 4]);
    let started = Instant::now();
    let result = runner.run(&(0u8..14, any::<u64>(), any::<u64>()), |(kind, a, b)| {
        n.set(n.get() + 1);
        let (desc, bytes) = mutate(&orig, &lay, kind, a, b);
        let v = exercise(dir.path(), n.get(), &bytes).map_err(|e| TestCaseError::fail(format!("{desc}: {e}")))?;
        if v != Verdict::RefusedByInventory && std::env::var_os("GGUF_FUZZ_VERBOSE").is_some() {
            eprintln!("{v:?}: {desc}: {}", std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default().trim());
        }
        let mut t = tally.get();
        t[v as usize] += 1;
        tally.set(t);
        Ok(())
    });
    let t = tally.get();
    eprintln!(
        "gguf fuzz ({arch}): {} cases in {:.1} s: {} refused by inventory, {} refused by generate (llama.cpp's loader quoted), {} died in the engine (failed record), {} ran",
        n.get(),
        started.elapsed().as_secs_f64(),
        t[0],
        t[1],
        t[3],
        t[2]
    );
    result.unwrap();
}

/// Found by the fuzz target: a NaN rope base made every logit NaN; it is now refused up front.
#[test]
fn rope_freq_base_nan_is_refused_by_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let (orig, lay) = forge_once(dir.path(), "qwen3moe");
    let off = lay
        .fields
        .iter()
        .find_map(|f| match f {
            Field::Scalar { key, ty: 6, off, .. } if key == "qwen3moe.rope.freq_base" => Some(*off),
            _ => None,
        })
        .expect("the forged model has an F32 rope.freq_base");
    let mut m = orig.clone();
    put(&mut m, off, 4, f32::NAN.to_bits() as u64);
    assert_eq!(exercise(dir.path(), 1, &m), Ok(Verdict::RefusedByInventory));
}

// Inputs llama.cpp aborts on although the cause is in the file: each is refused in one line by
// `inventory`, resident `generate` and `generate --experts plan`, before any worker starts (no
// record is left), while its valid neighbours load and generate.

/// A copy of `model` with its metadata edited by `meta` and the tensors `retype` names stored as
/// another type (converted from F32).
fn rewritten(model: &Path, out: &Path, meta: impl Fn(&mut Vec<(String, Value)>), retype: impl Fn(&str) -> Option<GgmlType>) -> PathBuf {
    let g = Gguf::open(model).unwrap();
    let bytes = std::fs::read(model).unwrap();
    let mut w = GgufWriter { metadata: g.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(), ..Default::default() };
    meta(&mut w.metadata);
    for t in &g.tensors {
        w.tensor(TensorSpec::new(t.name.clone(), retype(&t.name).unwrap_or(t.ggml_type), &t.dims));
    }
    w.write(out, |i, spec, buf| {
        let t = &g.tensors[i];
        let src = &bytes[t.offset as usize..t.end() as usize];
        if spec.ggml_type == t.ggml_type {
            return buf.copy_from_slice(src);
        }
        assert_eq!(t.ggml_type, GgmlType::F32, "{}", t.name);
        let x: Vec<f32> = src.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        convert(spec.ggml_type, &x, buf);
    })
    .unwrap();
    out.to_path_buf()
}

fn convert(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    match ty.name() {
        // I32 over the same bytes: what a mislabelled router looks like.
        "I32" => out.copy_from_slice(&x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect::<Vec<u8>>()),
        "F64" => out.copy_from_slice(&x.iter().flat_map(|&v| f64::from(v).to_le_bytes()).collect::<Vec<u8>>()),
        "BF16" => out.copy_from_slice(&x.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect::<Vec<u8>>()),
        "Q8_0" => {
            for (blk, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = f16_round(amax / 127.0);
                o[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
                for (q, v) in o[2..].iter_mut().zip(blk) {
                    *q = if d == 0.0 { 0 } else { (v / d).round().clamp(-127.0, 127.0) as i8 as u8 };
                }
            }
        }
        t => panic!("no conversion to {t}"),
    }
}

/// A positive normal f32 (a Q8_0 scale) as the nearest-below F16 and its bits.
fn f16_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let b = v.to_bits();
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    assert!((1..31).contains(&exp), "{v} is not a normal F16");
    ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}
fn f16_round(v: f32) -> f32 {
    if v == 0.0 {
        return 0.0;
    }
    f32::from_bits(v.to_bits() & !0x1fff)
}

fn set_kv(m: &mut Vec<(String, Value)>, key: &str, v: Value) {
    match m.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = v,
        None => m.push((key.to_string(), v)),
    }
}

/// `bad` is refused in one line naming it and `needles` on every path that loads a model, and
/// no run (no record, no staging) is left behind.
fn refused_everywhere(dir: &Path, bad: &Path, needles: &[&str]) {
    let name = bad.to_str().unwrap();
    let mut all = vec![name];
    all.extend_from_slice(needles);
    common::assert_one_line_error(&common::run(&["inventory", name]), &all);
    for (i, extra) in [&[][..], &["--experts", "plan", "--slots", "5"][..]].iter().enumerate() {
        let rec = dir.join(format!("refused{i}"));
        let r = common::generate(bad, "hi", 2, &rec, extra);
        common::assert_one_line_error(&r, &all);
        assert!(!rec.exists(), "{extra:?}: a refused file reached a run: {} exists", rec.display());
        assert!(!PathBuf::from(format!("{}.partial", rec.display())).exists(), "{extra:?}: staging left behind");
    }
}

/// `model` generates resident; returns the generated tokens' surface.
fn generates(dir: &Path, model: &Path, name: &str) -> Vec<u8> {
    let rec = dir.join(name);
    let r = common::generate(model, "Experts stream from storage.", 8, &rec, &[]);
    assert_eq!(r.code, 0, "{}: {}{}", model.display(), r.stdout, r.stderr);
    std::fs::read(rec.join("tokens.bin")).unwrap_or_else(|e| panic!("{}: no tokens surface: {e}", rec.display()))
}

/// ggml asserts a CPU buffer starts on TENSOR_ALIGNMENT (32): a file whose alignment places a
/// tensor off it is refused; every alignment that keeps tensors on it loads and gives the same tokens.
#[test]
fn alignments_ggml_buffers_cannot_take_are_refused_and_the_rest_generate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = common::forge(d, "base.gguf", 5, &[]);
    let tokens = generates(d, &base, "base");
    for a in ["64", "4096"] {
        let m = common::forge(d, &format!("a{a}.gguf"), 5, &["--alignment", a]);
        assert_eq!(Gguf::open(&m).unwrap().alignment.to_string(), a);
        assert_eq!(generates(d, &m, &format!("a{a}")), tokens, "alignment {a}");
    }
    // Below 32: refused where a tensor lands off 32, run where every tensor happens to be on it.
    // A padding key moves the data section; each outcome is looked for among 32 paddings.
    for a in [1u32, 16] {
        let (mut off, mut on) = (false, false);
        for pad in 0..32 {
            let m = d.join(format!("a{a}-{pad}.gguf"));
            rewritten(
                &base,
                &m,
                |meta| {
                    set_kv(meta, "general.alignment", Value::U32(a));
                    set_kv(meta, "sovereign.test.pad", Value::Str("x".repeat(pad)));
                },
                |_| None,
            );
            let g = Gguf::open(&m).unwrap();
            assert_eq!(g.alignment, u64::from(a));
            match g.tensors.iter().find(|t| t.offset % 32 != 0) {
                Some(t) if !off => {
                    refused_everywhere(
                        d,
                        &m,
                        &[&format!("general.alignment is {a}: tensor `{}` starts at byte {}", t.name, t.offset), "TENSOR_ALIGNMENT (32)"],
                    );
                    off = true;
                }
                None if !on => {
                    assert_eq!(generates(d, &m, &format!("a{a}-{pad}")), tokens, "alignment {a}, every tensor on 32");
                    on = true;
                }
                _ => {}
            }
            std::fs::remove_file(&m).unwrap();
        }
        assert!(off, "alignment {a}: no padding put a tensor off 32");
        assert!(on || a == 1, "alignment {a}: no padding kept every tensor on 32");
    }
}

/// The SPM tokenizer (`llama`) over the forged GPT-2 byte vocabulary has no `<0xXX>` tokens:
/// llama.cpp's byte fallback aborts in unordered_map::at. The same tokens as SPM byte tokens run.
#[test]
fn an_spm_vocabulary_without_byte_tokens_is_refused_and_one_with_them_generates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = common::forge(d, "base.gguf", 6, &[]);
    let bad = rewritten(&base, &d.join("spm-gpt2.gguf"), |m| set_kv(m, "tokenizer.ggml.model", Value::Str("llama".into())), |_| None);
    refused_everywhere(d, &bad, &["tokenizer.ggml.model is \"llama\" but byte 0x00 has no token", "unordered_map::at"]);

    let spm = rewritten(
        &base,
        &d.join("spm.gguf"),
        |m| {
            set_kv(m, "tokenizer.ggml.model", Value::Str("llama".into()));
            for (k, v) in m.iter_mut() {
                match (k.as_str(), v) {
                    ("tokenizer.ggml.tokens", Value::Array(t)) => (0..256).for_each(|b| t[b] = Value::Str(format!("<0x{b:02X}>"))),
                    // LLAMA_TOKEN_TYPE_BYTE: decoded through the byte the text names.
                    ("tokenizer.ggml.token_type", Value::Array(t)) => (0..256).for_each(|b| t[b] = Value::I32(6)),
                    _ => {}
                }
            }
        },
        |_| None,
    );
    assert!(!generates(d, &spm, "spm").is_empty());
}

/// ggml-cpu has no matrix product for I32 or F64 weights (a null vec_dot: SIGSEGV); routers and
/// projections of those types are refused, and F16, BF16 and Q8_0 routers generate.
#[test]
fn weights_the_cpu_cannot_multiply_are_refused_and_float_routers_generate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = common::forge(d, "base.gguf", 7, &[]);
    let router = |n: &str| n.ends_with("ffn_gate_inp.weight");
    for (ty, which, first) in
        [(26u32, "router", "blk.0.ffn_gate_inp.weight"), (28, "router", "blk.0.ffn_gate_inp.weight"), (26, "attn_q", "blk.0.attn_q.weight")]
    {
        let ty = GgmlType(ty);
        let bad = rewritten(
            &base,
            &d.join(format!("{which}-{ty}.gguf")),
            |_| {},
            |n| (if which == "router" { router(n) } else { n.ends_with("attn_q.weight") }).then_some(ty),
        );
        refused_everywhere(d, &bad, &[&format!("tensor `{first}` is {ty}: ggml's CPU backend has no matrix product")]);
    }
    let f16 = common::forge(d, "f16.gguf", 7, &["--f16-router"]);
    assert!(!generates(d, &f16, "f16").is_empty());
    for ty in [GgmlType(30), GgmlType::Q8_0] {
        let m = rewritten(&base, &d.join(format!("router-{ty}.gguf")), |_| {}, |n| router(n).then_some(ty));
        assert_eq!(Gguf::open(&m).unwrap().tensor("blk.1.ffn_gate_inp.weight").unwrap().ggml_type, ty);
        assert!(!generates(d, &m, &format!("router-{ty}")).is_empty(), "{ty}");
    }
}
