//! The draft model of speculative decoding in plans: `strata plan --draft-model` shows the draft's stages
//! on its `--draft-devices` and counts them in each device's headroom and fit (refusing, naming the device
//! and the shortfall, when both models do not fit together); the plan predicts the ledgers once both are
//! loaded; and the app's settings (`EngineSettings`) validate the drafting values naming their field, plan
//! the draft, and emit its `strata serve` flags.

use crate::common::{self, stderr, strata};

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use serde_json::Value;
use strata::device::{DeviceKind, DeviceSet};
use strata::engine::{prefill, Sequence};
use strata::gguf::GgufFile;
use strata::model::synthetic::{SyntheticSpec, SyntheticVocab};
use strata::model::{KvType, LoadOptions, Model};
use strata::plan::draft::{select_devices, DraftInput};
use strata::plan::settings::{EngineSettings, Speculative};
use strata::threadpool::ThreadPool;

const MIB: u64 = 1 << 20;

fn json_of(o: &Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {out}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

fn i(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

fn model() -> String {
    common::model_path().display().to_string()
}

/// A file in a directory of this test process's own.
fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-plan-draft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write temp file");
    p
}

/// A small model whose vocabulary is not the default model's (SentencePiece, a few hundred tokens).
fn other_vocab_model() -> PathBuf {
    let spec = SyntheticSpec { vocab: SyntheticVocab::Spm, ..Default::default() };
    temp_file("other-vocab.gguf", &spec.to_gguf())
}

const SPLIT: [&str; 6] = ["--devices", "sim:200,sim:400", "--layer-split", "15", "-c", "2048"];

#[test]
fn plan_shows_the_draft_on_its_device_and_counts_it_in_that_devices_headroom() {
    let m = model();
    let mut plain = vec!["plan", "--json"];
    plain.extend(SPLIT);
    let without = json_of(&strata(&plain));
    assert!(without.get("draft").is_none(), "no draft section without a draft model: {without}");
    let mut with = plain.clone();
    with.extend(["--draft-model", &m, "--draft-devices", "1"]);
    let v = json_of(&strata(&with));

    let draft = &v["draft"];
    assert_eq!(draft["model"], m.as_str());
    assert_eq!(draft["layers"], 30);
    let ds = draft["stages"].as_array().expect("draft stages");
    assert_eq!(ds.len(), 1, "{draft}");
    let d = &ds[0];
    assert_eq!(d["device"], "1 (sim:400)");
    assert_eq!(d["layers"], serde_json::json!([0, 30]));
    // The same model as its own draft: all its layers' weights and KV on one device, at the same positions.
    let (t0, t1) = (&v["stages"][0], &v["stages"][1]);
    assert_eq!(u(&d["weights_bytes"]), u(&t0["weights_bytes"]) + u(&t1["weights_bytes"]), "{v}");
    assert_eq!(u(&d["kv_bytes_per_token"]), u(&t0["kv_bytes_per_token"]) + u(&t1["kv_bytes_per_token"]));
    assert_eq!(u(&d["kv_device_bytes"]), 32 * 64 * u(&d["kv_bytes_per_token"]), "2048 positions: 32 pages");
    let draft_total = u(&d["total_bytes"]);
    assert_eq!(draft_total, u(&d["weights_bytes"]) + u(&d["kv_device_bytes"]) + u(&d["scratch_bytes"]));

    // Device 1's one headroom drops by what the draft takes; device 0's does not move.
    let h = |v: &Value, s: usize| i(&v["stages"][s]["headroom_bytes"]);
    assert_eq!(h(&without, 1) - h(&v, 1), draft_total as i64, "{v}");
    assert_eq!(h(&without, 0), h(&v, 0));
    assert_eq!(i(&d["headroom_bytes"]), h(&v, 1), "one headroom per device");
    let dev1 = &v["devices"][1];
    assert_eq!(u(&dev1["total_bytes"]), u(&t1["total_bytes"]) + draft_total);
    assert_eq!(u(&dev1["draft_bytes"]), draft_total);
    assert_eq!(i(&dev1["headroom_bytes"]), (400 * MIB) as i64 - u(&dev1["total_bytes"]) as i64);
    assert_eq!(v["devices"][0]["draft_bytes"], 0);
    // The model's own stage figures are unchanged.
    assert_eq!(t1["total_bytes"], without["stages"][1]["total_bytes"]);

    // In text: the draft's table under the model's, and the shared device's one headroom.
    let mut text = vec!["plan"];
    text.extend(SPLIT);
    text.extend(["--draft-model", &m, "--draft-devices", "1"]);
    let o = strata(&text);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("draft {m}: 30 layers on 1 (sim:400)")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("1 (sim:400)  0..30")), "{out}");
    assert!(out.contains("device 1 (sim:400) holds both models"), "{out}");
}

#[test]
fn the_draft_goes_on_the_first_device_unless_told() {
    let m = model();
    let mut args = vec!["plan", "--json", "--draft-model", &m];
    args.extend(SPLIT);
    let v = json_of(&strata(&args));
    assert_eq!(v["draft"]["stages"][0]["device"], "0 (sim:200)", "{v}");
    assert!(u(&v["devices"][0]["draft_bytes"]) > 0 && v["devices"][1]["draft_bytes"] == 0, "{v}");
}

#[test]
fn a_draft_that_does_not_fit_beside_the_model_fails_naming_the_device_and_the_shortfall() {
    let m = model();
    // sim:150 holds the model's layers 15..30 (about 83 MiB) or the draft (about 118 MiB), not both.
    let o = strata(&[
        "plan",
        "--devices",
        "sim:200,sim:150",
        "--layer-split",
        "15",
        "-c",
        "2048",
        "--draft-model",
        &m,
        "--draft-devices",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with(
            "strata: error: device 1 (sim:150) cannot hold the draft model's layers 0..30 beside layers 15..30"
        ),
        "{err}"
    );
    assert!(lines[0].contains("with 150.0 MiB free") && lines[0].contains("short by"), "{err}");
    // Without the draft the same split fits.
    let o = strata(&["plan", "--devices", "sim:200,sim:150", "--layer-split", "15", "-c", "2048"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn bad_draft_flags_on_plan_are_one_clear_line() {
    let m = model();
    let other = other_vocab_model();
    let text = temp_file("notes.gguf", b"not a model\n");
    let cases: [(Vec<&str>, &str); 4] = [
        (vec!["--draft-model", &m, "--draft-devices", "2"], "device 2 is not among the 2 device(s)"),
        (vec!["--draft-model", &m, "--draft-devices", "1,1"], "device 1 is listed twice"),
        (vec!["--draft-model", other.to_str().unwrap()], "cannot draft for"),
        (vec!["--draft-model", text.to_str().unwrap()], "not a GGUF file"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["plan"];
        args.extend(SPLIT);
        args.extend(extra.iter().copied());
        let o = strata(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(err.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{err}");
        assert!(err.contains(needle), "{args:?}: expected {needle:?} in {err}");
    }
}

fn sims(mibs: &[u64]) -> DeviceSet {
    let kinds: Vec<DeviceKind> = mibs.iter().map(|m| DeviceKind::Sim { capacity_bytes: m * MIB }).collect();
    DeviceSet::from_kinds(&kinds, 0).expect("sim devices")
}

#[test]
fn the_plan_with_a_draft_predicts_both_models_in_the_ledgers() {
    let file = Arc::new(GgufFile::open(&common::model_path()).expect("model opens"));
    let opts = LoadOptions {
        devices: sims(&[200, 400]),
        split: Some(vec![15]),
        max_context: Some(2048),
        ..Default::default()
    };
    let draft = DraftInput { file: file.clone(), devices: select_devices(&opts.devices, &[1]).expect("device 1") };
    let n = 300;
    let plan = strata::plan::plan_with_draft(&file, &opts, Some(n), 1, Some(&draft)).expect("plan");
    assert!(plan.fits, "{:?}", plan.problem);

    let target = Model::from_file_with(file.clone(), &opts).expect("the model loads");
    let dopts = LoadOptions { devices: draft.devices.clone(), split: None, ..opts.clone() };
    let drafter = Model::from_file_with(file.clone(), &dopts).expect("the draft loads");
    let pool = ThreadPool::new(2);
    let prompt: Vec<u32> = common::tokens(n, target.cfg.n_vocab, 3);
    let mut seq = Sequence::new(&target, KvType::F16, 2048).expect("sequence");
    prefill(&target, &pool, &mut seq, &prompt, 512).expect("prefill");
    let mut dseq = Sequence::new(&drafter, KvType::F16, 2048).expect("draft sequence");
    prefill(&drafter, &pool, &mut dseq, &prompt, 512).expect("draft prefill");

    for (d, device) in plan.devices.iter().zip(&opts.devices.devices) {
        let actual = device.usage().total_bytes;
        let err = (d.total_bytes as f64 - actual as f64).abs() / actual as f64;
        println!("{}: plan {} bytes (draft {}), ledger {actual} bytes", d.device, d.total_bytes, d.draft_bytes);
        assert!(err < 0.05, "{}: plan {} vs ledger {actual}", d.device, d.total_bytes);
    }
    assert!(plan.devices[1].draft_bytes > 100 * MIB && plan.devices[0].draft_bytes == 0);
}

// The app's settings: the drafting values, validated naming their field, planned and turned into flags.

fn settings_for_draft(draft: &str) -> EngineSettings {
    EngineSettings {
        model_path: Some(model()),
        devices: "sim:200,sim:400".into(),
        layer_split: "15".into(),
        max_context: Some(2048),
        speculative: Speculative::Draft { model_path: draft.to_owned() },
        draft_devices: vec![1],
        ..EngineSettings::default()
    }
}

fn target_file() -> Arc<GgufFile> {
    Arc::new(GgufFile::open(&common::model_path()).expect("model opens"))
}

#[test]
fn settings_with_a_draft_model_plan_it_and_give_its_flags() {
    let s = settings_for_draft(&model());
    let plan = s.plan(&target_file()).expect("plan");
    let draft = plan.draft.as_ref().expect("the draft is planned");
    assert_eq!(draft.rows.len(), 1);
    assert_eq!((draft.rows[0].index, draft.rows[0].layers), (1, (0, 30)));
    assert_eq!(plan.devices[1].draft_bytes, draft.rows[0].total_bytes);
    assert_eq!(plan.rows[1].headroom_bytes, plan.devices[1].headroom_bytes);
    let flags = s.serve_flags().join(" ");
    assert!(
        flags.ends_with(&format!("--draft-model {} --draft-devices 1 --draft-max 16 --draft-min 1", model())),
        "{flags}"
    );
    // Drafting off: no draft planned, no drafting flag, whatever the drafting values say.
    let off = EngineSettings { speculative: Speculative::Off, draft_max: 0, ..s.clone() };
    assert!(off.plan(&target_file()).expect("plan").draft.is_none());
    assert!(!off.serve_flags().iter().any(|f| f.starts_with("--draft") || f == "--spec"), "{:?}", off.serve_flags());
    // A draft that does not fit beside the model is a plan that does not fit, not a field error.
    let tight = EngineSettings { devices: "sim:200,sim:150".into(), ..s };
    let p = tight.plan(&target_file()).expect("a plan");
    assert!(!p.fits);
    assert!(p.problem.as_deref().is_some_and(|m| m.contains("device 1 (sim:150)") && m.contains("short by")), "{p:?}");
}

#[test]
fn invalid_drafting_settings_name_their_field() {
    let m = model();
    let other = other_vocab_model();
    let text = temp_file("text.gguf", b"this is a text file, not GGUF");
    let missing = Path::new("/nonexistent/strata-draft.gguf");
    let cases: Vec<(EngineSettings, &str, &str)> = vec![
        (EngineSettings { draft_max: 0, ..settings_for_draft(&m) }, "draft_max", "between 1 and 256"),
        (EngineSettings { draft_max: 257, ..settings_for_draft(&m) }, "draft_max", "between 1 and 256"),
        (
            EngineSettings { draft_max: 4, draft_min: 5, ..settings_for_draft(&m) },
            "draft_min",
            "5 is more than the most drafts",
        ),
        (settings_for_draft(" "), "speculative.model_path", "empty"),
        (settings_for_draft(text.to_str().unwrap()), "speculative.model_path", "not a GGUF file"),
        (settings_for_draft(missing.to_str().unwrap()), "speculative.model_path", "cannot open"),
        (settings_for_draft(other.to_str().unwrap()), "speculative.model_path", "cannot draft for this model"),
        (EngineSettings { draft_devices: vec![2], ..settings_for_draft(&m) }, "draft_devices", "not among the 2"),
        (EngineSettings { draft_devices: vec![0, 0], ..settings_for_draft(&m) }, "draft_devices", "twice"),
        (
            EngineSettings { speculative: Speculative::Ngram, draft_max: 300, ..settings_for_draft(&m) },
            "draft_max",
            "between 1 and 256",
        ),
    ];
    for (s, field, needle) in cases {
        let e = s.plan(&target_file()).expect_err(field);
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains(needle), "{field}: expected {needle:?} in {:?}", e.message);
    }
    // The checks that need no model file name the same fields.
    let e = EngineSettings { draft_devices: vec![5], ..settings_for_draft(&m) }.load_options().unwrap_err();
    assert_eq!(e.field, "draft_devices");
    let e = settings_for_draft(text.to_str().unwrap()).open_draft().unwrap_err();
    assert_eq!(e.field, "speculative.model_path");
}
