//! `strata quantize` end to end: the default model to f16 (every value kept up to f16 rounding, metadata
//! byte for byte, the same greedy text), a round trip per type on a synthetic model with its error bounded,
//! llama-quantize's fallbacks for rows that are not whole blocks, and bad input (one line naming the
//! problem, a non-zero exit, no file left behind).

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use strata::gguf::{GgufFile, GgufValue, GgufWriter, TensorInfo};
use strata::quant::{self, GgmlType};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("the strata binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// Runs `strata quantize IN OUT --type ty`, which must succeed.
fn quantize(input: &Path, output: &Path, ty: &str) -> Output {
    let o = strata(&["quantize", s(input), s(output), "--type", ty]);
    assert!(o.status.success(), "quantize to {ty} failed: {}", stderr(&o));
    o
}

/// A failed run: non-zero exit, one line on stderr that mentions every needle, and no panic.
fn assert_clean_failure(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(lines[0].starts_with("strata: error: "), "{:?}", lines[0]);
    for n in needles {
        assert!(lines[0].contains(n), "expected {n:?} in {:?}", lines[0]);
    }
}

/// The names of the entries of `dir`.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Every value of tensor `t`, dequantized by the library.
fn values(f: &GgufFile, t: &TensorInfo) -> Vec<f32> {
    let mut x = vec![0f32; t.n_elements() as usize];
    quant::try_dequantize_row(t.ty, f.tensor_data(t), &mut x).expect("whole blocks");
    x
}

/// Whether llama-quantize would quantize `t` (a weight matrix; see src/cli/quantize.rs).
fn is_matrix(t: &TensorInfo) -> bool {
    t.name.ends_with("weight") && t.dims.len() >= 2 && t.dims[1..].iter().any(|&d| d > 1)
}

/// The metadata of `a` and `b` are equal in order, type and value, except `general.file_type`, which `b`
/// has as `want_file_type`: in `a`'s place, or last when `a` has none.
fn assert_same_metadata(a: &GgufFile, b: &GgufFile, want_file_type: u32) {
    let file_type_at = |f: &GgufFile| f.metadata.iter().position(|(k, _)| k == "general.file_type");
    let want_at = file_type_at(a).unwrap_or(a.metadata.len());
    assert_eq!(file_type_at(b), Some(want_at), "general.file_type's place");
    assert_eq!(b.get("general.file_type"), Some(&GgufValue::U32(want_file_type)), "general.file_type");
    let others =
        |f: &'_ GgufFile| f.metadata.iter().filter(|(k, _)| k != "general.file_type").cloned().collect::<Vec<_>>();
    let (ma, mb) = (others(a), others(b));
    assert_eq!(ma.len(), mb.len(), "metadata key count");
    for ((ka, va), (kb, vb)) in ma.iter().zip(&mb) {
        assert_eq!(ka, kb, "metadata order");
        assert_eq!(va, vb, "metadata {ka}");
        assert_eq!(va.value_type(), vb.value_type(), "metadata {ka} type");
    }
    assert_eq!(a.alignment, b.alignment);
    assert_eq!(a.version, b.version);
}

/// Where the tensor index starts: the first tensor's name, length-prefixed, found in the file's bytes.
fn index_start(bytes: &[u8], first_tensor: &str) -> usize {
    let mut needle = (first_tensor.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(first_tensor.as_bytes());
    bytes.windows(needle.len()).position(|w| w == needle).expect("the first tensor's name is in the file")
}

/// Greedy tokens of `model` on a short prompt.
fn greedy_tokens(model: &Path, n: usize) -> Vec<u64> {
    let n = n.to_string();
    let args = ["run", "-m", s(model), "-n", &n, "--temp", "0", "-p", "The capital of France is", "--json"];
    let o = strata(&args);
    assert!(o.status.success(), "run on {} failed: {}", model.display(), stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("run --json prints JSON");
    v["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().expect("token id")).collect()
}

#[test]
fn the_default_model_to_f16_keeps_every_value_and_the_metadata() {
    let model = common::model_path();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("f16.gguf");
    let o = quantize(&model, &out, "f16");
    let err = stderr(&o);
    assert!(err.contains("tensors requantized") && err.contains("MB ->"), "summary line: {err}");
    assert_eq!(entries(dir.path()), ["f16.gguf"], "only OUT is left");

    let a = GgufFile::open(&model).expect("model");
    let b = GgufFile::open(&out).expect("the f16 copy reads");
    assert_same_metadata(&a, &b, 1);
    assert_eq!(a.tensors.len(), b.tensors.len());
    let mut n_matrices = 0;
    for (ta, tb) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!((&ta.name, &ta.dims), (&tb.name, &tb.dims), "tensor order and shape");
        if is_matrix(ta) {
            n_matrices += 1;
            assert_eq!(tb.ty, GgmlType::F16, "{}", tb.name);
            // q4_1 / q8_0 values are not all f16 numbers, so the copy holds each one rounded to the
            // nearest f16: exactly that, for every value of every matrix.
            let (xa, xb) = (values(&a, ta), values(&b, tb));
            for (i, (va, vb)) in xa.iter().zip(&xb).enumerate() {
                let want = half::f16::from_f32(*va).to_f32();
                assert!(want.to_bits() == vb.to_bits(), "{} value {i}: {va} became {vb}, expected {want}", ta.name);
            }
        } else {
            assert_eq!(tb.ty, GgmlType::F32, "{} stays f32", tb.name);
            assert_eq!(a.tensor_data(ta), b.tensor_data(tb), "{} is copied byte for byte", ta.name);
        }
    }
    assert!(n_matrices >= 30 * 7, "the model's matrices were all seen ({n_matrices})");

    // Metadata byte for byte: everything before the tensor index is the same but the four bytes of
    // general.file_type's value (q4_1 = 3 became f16 = 1).
    let (ba, bb) = (std::fs::read(&model).expect("model"), std::fs::read(&out).expect("copy"));
    let first = &a.tensors[0].name;
    let (ia, ib) = (index_start(&ba, first), index_start(&bb, first));
    assert_eq!(ia, ib, "the metadata takes the same bytes");
    let diff: Vec<usize> = (0..ia).filter(|&i| ba[i] != bb[i]).collect();
    assert!(diff.len() == 1 && bb[diff[0]] == 1, "metadata bytes differ at {diff:?}");

    // The copy runs and says what the original says.
    let (ga, gb) = (greedy_tokens(&model, 8), greedy_tokens(&out, 8));
    assert_eq!(ga[..4], gb[..4], "greedy tokens of q4_1 {ga:?} and of its f16 copy {gb:?}");
}

/// Relative RMS error of `got` against `want`.
fn rel_rms(want: &[f32], got: &[f32]) -> f64 {
    let (mut err, mut norm) = (0f64, 0f64);
    for (w, g) in want.iter().zip(got) {
        err += (*w as f64 - *g as f64).powi(2);
        norm += (*w as f64).powi(2);
    }
    (err / norm).sqrt()
}

#[test]
fn every_type_round_trips_a_synthetic_model_within_its_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("synth-f32.gguf");
    let o = strata(&["synth", "-o", s(&src), "--type", "f32"]);
    assert!(o.status.success(), "synth: {}", stderr(&o));
    let a = GgufFile::open(&src).expect("synthetic model");
    // (type, ggml type, llama.cpp file type, largest relative RMS error of a matrix). Measured on these
    // uniform random weights: f16 0.022%, q8_0 0.38%, q6_K 1.3%, q5_K 2.8%, q5_1 3.0%, q5_0 3.1%, q4_K 5.5%,
    // q4_1 6.1%, iq4_nl 6.4%, iq4_xs 6.5%, q4_0 6.5%, q3_K 12.6%, mxfp4 14.4%, q2_K 23.5%. The
    // bounds leave room for another seed or shape, not for a broken quantizer (errors of order 100%).
    let cases = [
        ("f16", GgmlType::F16, 1, 0.001),
        ("q8_0", GgmlType::Q8_0, 7, 0.01),
        ("q6_K", GgmlType::Q6K, 18, 0.03),
        ("q4_1", GgmlType::Q4_1, 3, 0.09),
        ("q4_K", GgmlType::Q4K, 14, 0.09),
        ("q4_0", GgmlType::Q4_0, 2, 0.10),
        ("q5_0", GgmlType::Q5_0, 8, 0.05),
        ("q5_1", GgmlType::Q5_1, 9, 0.05),
        ("q5_K", GgmlType::Q5K, 16, 0.05),
        ("q3_K", GgmlType::Q3K, 11, 0.20),
        ("q2_K", GgmlType::Q2K, 10, 0.35),
        ("iq4_nl", GgmlType::IQ4NL, 25, 0.10),
        ("iq4_xs", GgmlType::IQ4XS, 30, 0.10),
        ("mxfp4", GgmlType::MXFP4, 38, 0.20),
    ];

    for (name, ty, file_type, bound) in cases {
        let out = dir.path().join(format!("synth-{name}.gguf"));
        quantize(&src, &out, name);
        let b = GgufFile::open(&out).expect("quantized model reads");
        assert_same_metadata(&a, &b, file_type);
        assert_eq!(a.tensors.len(), b.tensors.len());
        let mut worst = (0f64, String::new());
        for (ta, tb) in a.tensors.iter().zip(&b.tensors) {
            assert_eq!((&ta.name, &ta.dims), (&tb.name, &tb.dims));
            if !is_matrix(ta) {
                assert_eq!((tb.ty, a.tensor_data(ta)), (GgmlType::F32, b.tensor_data(tb)), "{} kept", ta.name);
                continue;
            }
            assert_eq!(tb.ty, ty, "{}: the synthetic rows are whole blocks of every type", tb.name);
            let e = rel_rms(&values(&a, ta), &values(&b, tb));
            if e > worst.0 {
                worst = (e, ta.name.clone());
            }
        }
        eprintln!("{name}: worst relative RMS error {:.4}% ({})", worst.0 * 100.0, worst.1);
        assert!(worst.0 > 0.0 && worst.0 < bound, "{name}: error {} of {} is not under {bound}", worst.0, worst.1);
        // The engine loads it and generates.
        let r = strata(&["run", "-m", s(&out), "-n", "4", "--temp", "0", "--ignore-eos", "-p", "the sea"]);
        assert!(r.status.success(), "run on {name}: {}", stderr(&r));
        assert!(!r.stdout.is_empty(), "run on {name} printed nothing");
    }
}

/// A small GGUF image (no model: only what `quantize` reads) with f32 tensors of the given shapes, values
/// from `fill(i)`.
fn write_model(path: &Path, tensors: &[(&str, &[u64])], fill: impl Fn(usize) -> f32) {
    let mut w = GgufWriter::new();
    w.set("general.architecture", GgufValue::str("llama"));
    w.set("general.file_type", GgufValue::U32(0));
    for (name, dims) in tensors {
        let n: u64 = dims.iter().product();
        let data = (0..n as usize).flat_map(|i| fill(i).to_le_bytes()).collect();
        w.add_tensor(name, dims, GgmlType::F32, data);
    }
    std::fs::write(path, w.to_bytes(3)).expect("write model");
}

#[test]
fn rows_that_are_not_whole_blocks_fall_back_like_llama_quantize() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("shapes.gguf");
    let shapes: [(&str, &[u64]); 4] =
        [("wide.weight", &[256, 3]), ("mid.weight", &[96, 4]), ("odd.weight", &[40, 3]), ("norm.weight", &[40])];
    write_model(&src, &shapes, |i| ((i * 37 % 101) as f32 - 50.0) / 50.0);
    let want = [
        ("q6_K", [GgmlType::Q6K, GgmlType::Q8_0, GgmlType::F16, GgmlType::F32]),
        ("q4_K", [GgmlType::Q4K, GgmlType::Q5_0, GgmlType::F16, GgmlType::F32]),
        ("q4_0", [GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::F16, GgmlType::F32]),
        ("q5_K", [GgmlType::Q5K, GgmlType::Q5_1, GgmlType::F16, GgmlType::F32]),
        ("q3_K", [GgmlType::Q3K, GgmlType::Q4_0, GgmlType::F16, GgmlType::F32]),
        ("q2_K", [GgmlType::Q2K, GgmlType::Q4_0, GgmlType::F16, GgmlType::F32]),
        ("iq4_xs", [GgmlType::IQ4XS, GgmlType::IQ4NL, GgmlType::F16, GgmlType::F32]),
        ("mxfp4", [GgmlType::MXFP4, GgmlType::MXFP4, GgmlType::F16, GgmlType::F32]),
    ];
    for (name, types) in want {
        let out = dir.path().join(format!("shapes-{name}.gguf"));
        let o = quantize(&src, &out, name);
        let f = GgufFile::open(&out).expect("reads");
        let got: Vec<GgmlType> = f.tensors.iter().map(|t| t.ty).collect();
        assert_eq!(got, types, "{name}");
        let err = stderr(&o);
        assert!(err.contains("rows of 40 values") && err.contains("f16 instead (odd.weight)"), "{name}: {err}");
    }
}

#[test]
fn bad_input_is_one_line_and_leaves_no_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ins, outs) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir_all(&ins).expect("dir");
    std::fs::create_dir_all(&outs).expect("dir");
    let out = outs.join("model.gguf");
    let o_s = s(&out);

    // Not a GGUF file at all, and a GGUF file that ends early: the reader's error, with the input named.
    let text = ins.join("notes.txt");
    std::fs::write(&text, "these are not the weights you are looking for\n").expect("write");
    assert_clean_failure(&strata(&["quantize", s(&text), o_s, "--type", "q8_0"]), &["notes.txt", "not a GGUF file"]);
    let model = std::fs::read(common::model_path()).expect("model");
    let cut = ins.join("cut.gguf");
    std::fs::write(&cut, &model[..4096]).expect("write");
    assert_clean_failure(&strata(&["quantize", s(&cut), o_s, "--type", "q8_0"]), &["cut.gguf", "ends early"]);
    let missing = ins.join("missing.gguf");
    assert_clean_failure(&strata(&["quantize", s(&missing), o_s, "--type", "q8_0"]), &["missing.gguf", "cannot open"]);

    // An unknown type names the valid ones, on the same line.
    let good = ins.join("good.gguf");
    write_model(&good, &[("w.weight", &[64, 2])], |i| i as f32);
    let o = strata(&["quantize", s(&good), o_s, "--type", "iq2_xxs"]);
    assert_eq!(o.status.code(), Some(2));
    assert_clean_failure(
        &o,
        &[
            "\"iq2_xxs\"",
            "f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, q4_K_M, q5_K_M, iq4_nl, iq4_xs, mxfp4",
        ],
    );
    assert_eq!(entries(&outs), Vec::<String>::new(), "no file after the refusals");

    // IN == OUT, by the same path, another spelling of it, and a link to it: refused, IN unchanged.
    let before = std::fs::read(&good).expect("read");
    let dotted = ins.join(".").join("good.gguf");
    let link = ins.join("link.gguf");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&good, &link).expect("symlink");
    #[cfg(not(unix))]
    std::fs::copy(&good, &link).expect("copy");
    for same in [&good, &dotted, &link] {
        let o = strata(&["quantize", s(&good), s(same), "--type", "q8_0"]);
        assert_clean_failure(&o, &["same file"]);
    }
    assert_eq!(std::fs::read(&good).expect("read"), before, "IN is untouched");

    // Bad values found while writing: the temporary file is removed and an existing OUT is untouched.
    let nan = ins.join("nan.gguf");
    // a.weight (64 values) converts; b.weight's row 1 holds a NaN.
    write_model(&nan, &[("a.weight", &[32, 2]), ("b.weight", &[64, 2])], |i| if i == 70 { f32::NAN } else { 1.0 });
    std::fs::write(&out, "the old model").expect("write");
    let o = strata(&["quantize", s(&nan), o_s, "--type", "q4_0"]);
    assert_clean_failure(&o, &["nan.gguf", "\"b.weight\"", "row 1, value 6 is NaN"]);
    assert_eq!(entries(&outs), ["model.gguf"], "no temporary file is left");
    assert_eq!(std::fs::read(&out).expect("read"), b"the old model", "OUT is untouched");

    // And a good run replaces it.
    quantize(&good, &out, "q8_0");
    assert_eq!(entries(&outs), ["model.gguf"]);
    assert_eq!(GgufFile::open(&out).expect("reads").tensors[0].ty, GgmlType::Q8_0);
}

#[test]
fn help_lists_the_types() {
    let o = strata(&["quantize", "--help"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(
            "[possible values: f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, q4_K_M, q5_K_M, iq4_nl, iq4_xs, mxfp4]"
        ),
        "{out}"
    );
}

#[test]
fn a_gpu_without_kernels_for_a_type_refuses_the_model_in_one_line() {
    // The CUDA backend has no kernels for q2_K, q3_K or iq4_xs: a stage that would hold such a matrix is
    // refused when it loads, with the type named, never a panic; iq4_nl and mxfp4 run there. (The emulated
    // GPU runs the CUDA backend's code on the CPU, so this holds on a real card too.)
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("synth-f32.gguf");
    let o = strata(&["synth", "-o", s(&src), "--type", "f32"]);
    assert!(o.status.success(), "synth: {}", stderr(&o));
    for name in ["q2_K", "q3_K", "iq4_xs", "iq4_nl", "mxfp4"] {
        let out = dir.path().join(format!("synth-{name}.gguf"));
        quantize(&src, &out, name);
        let r = strata(&["run", "-m", s(&out), "-n", "2", "--temp", "0", "-p", "the sea", "--devices", "emu:64"]);
        if ["iq4_nl", "mxfp4"].contains(&name) {
            assert!(r.status.success(), "run on emu:64 with {name}: {}", stderr(&r));
            continue;
        }
        assert_clean_failure(&r, &[&format!("no GPU kernel for {name} weights")]);
        // And the same file runs on the CPU.
        let r = strata(&["run", "-m", s(&out), "-n", "2", "--temp", "0", "-p", "the sea"]);
        assert!(r.status.success(), "run on {name}: {}", stderr(&r));
    }
}
