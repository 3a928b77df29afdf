//! The patched CPU kernels' contract for rows of negative ids, on which a pass of a layer's
//! experts relies (patches 0005 and 0008): a row of `mul_mat_id`, or of a GLU given the ids by
//! `ggml_glu_skip_ids`, whose id is negative is not written, and every other row is bitwise the
//! row the kernel computes when every id is valid.

use super::{backends, sys};

const SENTINEL: u32 = 0x7fc0_beef; // a NaN no kernel writes

/// The ops under test, built from their inputs `a`, `b` and `ids`.
#[derive(Clone, Copy, Debug)]
enum Op {
    Swiglu,
    SwigluClamp,
    SwigluOai,
    Geglu,
    MulMatId { weights: u32 },
}

struct Case {
    op: Op,
    k: i64,      // row width of the inputs
    n_used: i64, // ids per token
    n_tok: i64,  // tokens
    bcast: bool, // mul_mat_id: one input row per token, shared by its ids
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// The result of `case` with these ids, every element first set to the sentinel.
fn compute(case: &Case, ids: &[i32]) -> Vec<u32> {
    backends::ensure_loaded().expect("the CPU module loads");
    let n_as = 6i64;
    // SAFETY: each call follows ggml.h and ggml-backend.h: a context with room for the tensors
    // and the graph, tensors allocated in one backend buffer before data is set or read with
    // their own sizes, and everything freed once, after the last use.
    unsafe {
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: 16 * sys::ggml_tensor_overhead() + sys::ggml_graph_overhead(),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        assert!(!ctx.is_null());
        let f32t = sys::ggml_type_GGML_TYPE_F32;
        let t_ids = sys::ggml_new_tensor_2d(ctx, sys::ggml_type_GGML_TYPE_I32, case.n_used, case.n_tok);
        let mut inputs = Vec::new();
        let out = match case.op {
            Op::MulMatId { weights } => {
                let as_ = sys::ggml_new_tensor_3d(ctx, weights, case.k, 8, n_as);
                let b = sys::ggml_new_tensor_3d(ctx, f32t, case.k, if case.bcast { 1 } else { case.n_used }, case.n_tok);
                inputs.push(as_);
                inputs.push(b);
                sys::ggml_mul_mat_id(ctx, as_, b, t_ids)
            }
            op => {
                let a = sys::ggml_new_tensor_3d(ctx, f32t, case.k, case.n_used, case.n_tok);
                let b = sys::ggml_new_tensor_3d(ctx, f32t, case.k, case.n_used, case.n_tok);
                inputs.push(a);
                inputs.push(b);
                let glu = match op {
                    Op::Swiglu => sys::ggml_swiglu_split(ctx, a, b),
                    Op::SwigluClamp => sys::ggml_swiglu_clamp(ctx, a, b, 1.5),
                    Op::SwigluOai => sys::ggml_swiglu_oai(ctx, a, b, 1.702, 1.5),
                    Op::Geglu => sys::ggml_geglu_split(ctx, a, b),
                    Op::MulMatId { .. } => unreachable!(),
                };
                sys::ggml_glu_skip_ids(glu, t_ids);
                glu
            }
        };
        let gf = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(gf, out);

        let dev = sys::ggml_backend_dev_by_type(sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_CPU);
        assert!(!dev.is_null());
        let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
        assert!(!backend.is_null());
        let buf = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buf.is_null());

        for (i, &t) in inputs.iter().enumerate() {
            let n = sys::ggml_nelements(t) as usize;
            let v = values(n, 7 + i as u64);
            if (*t).type_ == f32t {
                sys::ggml_backend_tensor_set(t, v.as_ptr().cast(), 0, sys::ggml_nbytes(t));
            } else {
                let mut q = vec![0u8; sys::ggml_nbytes(t)];
                let rows = n as i64 / case.k;
                sys::ggml_quantize_chunk((*t).type_, v.as_ptr(), q.as_mut_ptr().cast(), 0, rows, case.k, std::ptr::null());
                sys::ggml_backend_tensor_set(t, q.as_ptr().cast(), 0, q.len());
            }
        }
        sys::ggml_backend_tensor_set(t_ids, ids.as_ptr().cast(), 0, sys::ggml_nbytes(t_ids));
        let n_out = sys::ggml_nelements(out) as usize;
        let mut got = vec![SENTINEL; n_out];
        sys::ggml_backend_tensor_set(out, got.as_ptr().cast(), 0, sys::ggml_nbytes(out));

        assert_eq!(sys::ggml_backend_graph_compute(backend, gf), sys::ggml_status_GGML_STATUS_SUCCESS);
        sys::ggml_backend_tensor_get(out, got.as_mut_ptr().cast(), 0, sys::ggml_nbytes(out));

        sys::ggml_backend_buffer_free(buf);
        sys::ggml_backend_free(backend);
        sys::ggml_free(ctx);
        got
    }
}

/// Ids as a pass sees them, and the resident ids they come from: the experts of other passes
/// (1 and 4, every id of the last token among them) negative. Each expert the pass serves keeps
/// all its rows, as in a pass, since a kernel may take another path for fewer.
fn ids(case: &Case) -> (Vec<i32>, Vec<i32>) {
    let n = (case.n_used * case.n_tok) as usize;
    let last = n - case.n_used as usize;
    let valid: Vec<i32> = (0..n).map(|i| if i >= last { [1, 4][i % 2] } else { ((i * 5 + i / 3) % 6) as i32 }).collect();
    let skipped = valid.iter().map(|&e| if e == 1 || e == 4 { -1 } else { e }).collect();
    (skipped, valid)
}

fn check(case: Case) {
    let (skipped, valid) = ids(&case);
    let with_skips = compute(&case, &skipped);
    let all = compute(&case, &valid);
    let row = with_skips.len() / skipped.len();
    let mut n_skipped = 0;
    for (i, id) in skipped.iter().enumerate() {
        let (a, b) = (&with_skips[i * row..(i + 1) * row], &all[i * row..(i + 1) * row]);
        if *id < 0 {
            n_skipped += 1;
            assert!(a.iter().all(|&x| x == SENTINEL), "{:?}: row {i} of a negative id was written", case.op);
        } else {
            assert!(b.iter().all(|&x| x != SENTINEL), "{:?}: row {i} was not computed", case.op);
            assert_eq!(a, b, "{:?}: row {i} differs from the row computed with every id valid", case.op);
        }
    }
    assert!(n_skipped > 0);
}

#[test]
fn a_glu_given_ids_leaves_the_rows_of_negative_ids_and_computes_the_others_bitwise() {
    for op in [Op::Swiglu, Op::SwigluClamp, Op::SwigluOai, Op::Geglu] {
        check(Case { op, k: 40, n_used: 4, n_tok: 9, bcast: false });
    }
}

#[test]
fn mul_mat_id_leaves_the_rows_of_negative_ids_and_computes_the_others_bitwise() {
    // F32 (no conversion of the input rows), Q8_0 and Q4_K (converted, row by row, only where
    // some valid id reads them), with an input row per id and one per token
    for weights in [sys::ggml_type_GGML_TYPE_F32, sys::ggml_type_GGML_TYPE_Q8_0, sys::ggml_type_GGML_TYPE_Q4_K] {
        for bcast in [false, true] {
            check(Case { op: Op::MulMatId { weights }, k: 256, n_used: 4, n_tok: 9, bcast });
        }
    }
}
