//! The settings' checks, flags and plans.

use super::*;

#[test]
fn each_field_is_named_in_its_error() {
    let ok = EngineSettings::default();
    assert_eq!(ok.check(), Ok(()));
    let cases: Vec<(EngineSettings, &str)> = vec![
        (EngineSettings { devices: " ".into(), ..ok.clone() }, "devices"),
        (EngineSettings { devices: "gpu:1".into(), ..ok.clone() }, "devices"),
        (EngineSettings { layer_split: "x".into(), ..ok.clone() }, "layer_split"),
        (EngineSettings { devices: "cpu,emu:64".into(), kv: KvType::F32, ..ok.clone() }, "kv"),
        (EngineSettings { kv_resident: Some(0), ..ok.clone() }, "kv_resident"),
        (EngineSettings { experts: "cpu:3".into(), ..ok.clone() }, "experts"),
        (EngineSettings { experts: "host".into(), ..ok.clone() }, "experts"),
        (EngineSettings { max_context: Some(0), ..ok.clone() }, "max_context"),
        (EngineSettings { vram_reserve_mib: MAX_MIB + 1, ..ok.clone() }, "vram_reserve_mib"),
        (EngineSettings { devices: "sim:200".into(), vram_reserve_mib: 200, ..ok.clone() }, "vram_reserve_mib"),
        (EngineSettings { cache_slots: MAX_CACHE_SLOTS + 1, ..ok.clone() }, "cache_slots"),
        (EngineSettings { threads: Some(0), ..ok.clone() }, "threads"),
        (EngineSettings { parallel: Some(0), ..ok.clone() }, "parallel"),
        (EngineSettings { parallel: Some(MAX_PARALLEL + 1), ..ok.clone() }, "parallel"),
        (EngineSettings { speculative: Speculative::Ngram, parallel: Some(2), ..ok.clone() }, "parallel"),
        (EngineSettings { speculative: Speculative::Ngram, draft_max: 0, ..ok.clone() }, "draft_max"),
        (EngineSettings { speculative: Speculative::Ngram, draft_max: 257, ..ok.clone() }, "draft_max"),
        (EngineSettings { speculative: Speculative::Ngram, draft_min: 17, ..ok.clone() }, "draft_min"),
        (
            EngineSettings { speculative: Speculative::Draft { model_path: String::new() }, ..ok.clone() },
            "speculative.model_path",
        ),
        (
            EngineSettings {
                speculative: Speculative::Draft { model_path: "d.gguf".into() },
                draft_devices: vec![1],
                ..ok.clone()
            },
            "draft_devices",
        ),
        (
            EngineSettings {
                engine: EngineLocation::Remote {
                    url: "ftp://x".into(),
                    api_key: RemoteKey::None,
                    model: String::new(),
                    allow_insecure: false,
                },
                ..ok.clone()
            },
            "engine.url",
        ),
    ];
    for (s, field) in cases {
        let e = s.load_options().expect_err(field);
        assert_eq!(e.field, field, "{e}");
        assert!(!e.message.is_empty());
    }
}

fn remote(url: &str, allow_insecure: bool) -> EngineSettings {
    EngineSettings {
        engine: EngineLocation::Remote {
            url: url.into(),
            api_key: RemoteKey::New { key: "sk-remote-0123456789".into() },
            model: String::new(),
            allow_insecure,
        },
        ..EngineSettings::default()
    }
}

#[test]
fn an_http_endpoint_needs_a_loopback_host_or_allow_insecure() {
    for url in [
        "https://gpu-box:8000/v1",
        "https://10.0.0.2",
        "http://127.0.0.1:8080/v1",
        "http://127.3.2.1",
        "http://localhost:8080",
        "http://LOCALHOST",
        "http://[::1]:8080/v1",
        "http://user@127.0.0.1:9000",
    ] {
        assert_eq!(remote(url, false).check(), Ok(()), "{url}");
    }
    for url in [
        "http://gpu-box:8000/v1",
        "http://10.0.0.2:8080",
        "http://[::2]:8080",
        "http://localhost.example.com",
        "http://127.0.0.1.example.com",
        "http://127.0.0.1@gpu-box",
    ] {
        let e = remote(url, false).check().expect_err(url);
        assert_eq!((e.field.as_str(), e.message.as_str()), ("engine.url", INSECURE_URL_MESSAGE), "{url}");
        assert_eq!(remote(url, true).check(), Ok(()), "{url} with allow_insecure");
    }
    for url in ["ftp://x", "gpu-box:8000", "https://", "http://:80", "https://a b", "http://[::1"] {
        assert_eq!(remote(url, true).check().expect_err(url).field, "engine.url", "{url}");
    }
}

#[test]
fn a_key_reads_from_old_strings_and_tagged_values_and_never_shows_in_debug() {
    // Settings stored before keys were kept apart: the key itself (moved out by the app), or "" for none.
    let old = r#"{"kind":"remote","url":"https://h","api_key":"sk-old-secret","model":"m"}"#;
    let read: EngineLocation = serde_json::from_str(old).expect("old remote settings read");
    assert_eq!(
        read,
        EngineLocation::Remote {
            url: "https://h".into(),
            api_key: RemoteKey::New { key: "sk-old-secret".into() },
            model: "m".into(),
            allow_insecure: false,
        }
    );
    let none: RemoteKey = serde_json::from_str(r#""""#).unwrap();
    assert_eq!(none, RemoteKey::None);
    for key in [RemoteKey::None, RemoteKey::Kept { hint: "wxyz".into() }, RemoteKey::New { key: "k".into() }] {
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(serde_json::from_str::<RemoteKey>(&json).unwrap(), key, "{json}");
    }
    assert_eq!(serde_json::to_value(RemoteKey::Kept { hint: "wxyz".into() }).unwrap()["kind"], "kept");
    let e = serde_json::from_str::<RemoteKey>(r#"{"kind":"kept","hint":"","key":"x"}"#).unwrap_err();
    assert!(e.to_string().contains("key"), "{e}");
    assert!(serde_json::from_str::<RemoteKey>("7").is_err());
    let shown = format!("{:?}", remote("https://h", false));
    assert!(!shown.contains("sk-remote") && shown.contains("20 characters"), "{shown}");
    // The hint: the last 4 characters of a long key, nothing of a short one.
    assert_eq!(RemoteKey::kept_of("sk-0123456789abcd"), RemoteKey::Kept { hint: "abcd".into() });
    assert_eq!(RemoteKey::kept_of("short-key"), RemoteKey::Kept { hint: String::new() });
    assert_eq!(RemoteKey::kept_of(""), RemoteKey::None);
    // A new key is checked; a kept one is not the settings' to judge.
    let with_key = |key: &str| EngineSettings {
        engine: EngineLocation::Remote {
            url: "https://h".into(),
            api_key: RemoteKey::New { key: key.into() },
            model: String::new(),
            allow_insecure: false,
        },
        ..EngineSettings::default()
    };
    assert_eq!(with_key("  ").check().unwrap_err().field, "engine.api_key");
    assert_eq!(with_key("a\nb").check().unwrap_err().field, "engine.api_key");
}

#[test]
fn drafting_values_are_kept_but_unchecked_while_drafting_is_off() {
    let s = EngineSettings { draft_max: 0, draft_min: 900, draft_devices: vec![7], ..EngineSettings::default() };
    assert_eq!(s.load_options().map(|_| ()), Ok(()));
    assert!(!s.serve_flags().iter().any(|f| f.starts_with("--draft") || f == "--spec"));
    // Settings stored before speculative decoding existed read as off, with the CLI's defaults.
    let old = r#"{"model_path":null,"devices":"cpu","layer_split":"","kv":"f16","kv_resident":null,
        "max_context":null,"vram_reserve_mib":0,"cache_slots":4,"cache_mib":4096,"threads":null,
        "engine":{"kind":"local"}}"#;
    let read: EngineSettings = serde_json::from_str(old).expect("old settings read");
    assert_eq!(read, EngineSettings::default());
    assert_eq!((read.draft_max, read.draft_min), (16, 1));
}

#[test]
fn drafting_flags_say_what_the_settings_say() {
    let ngram = EngineSettings { speculative: Speculative::Ngram, draft_max: 8, draft_min: 2, ..Default::default() };
    assert!(ngram.serve_flags().join(" ").ends_with("--spec ngram --draft-max 8 --draft-min 2"));
    let draft = EngineSettings {
        devices: "sim:200,sim:400".into(),
        speculative: Speculative::Draft { model_path: "/m/draft model.gguf".into() },
        draft_devices: vec![1, 0],
        ..Default::default()
    };
    let f = draft.serve_flags();
    let at = f.iter().position(|x| x == "--draft-model").expect("--draft-model");
    assert_eq!(
        f[at..],
        ["--draft-model", "/m/draft model.gguf", "--draft-devices", "1,0", "--draft-max", "16", "--draft-min", "1"]
    );
}

#[test]
fn flags_say_what_the_settings_say() {
    let s = EngineSettings {
        devices: "sim:200,sim:400".into(),
        layer_split: "15".into(),
        kv: KvType::Int8,
        max_context: Some(4096),
        threads: Some(2),
        ..EngineSettings::default()
    };
    let f = s.serve_flags().join(" ");
    assert!(!f.contains("--parallel"), "None is the server's default: {f}");
    assert!(!f.contains("--experts"), "auto is the server's default: {f}");
    let experts = EngineSettings { experts: "cpu:0..12".into(), ..s.clone() };
    assert!(experts.serve_flags().join(" ").contains(" --kv int8 --experts cpu:0..12 "), "{:?}", experts.serve_flags());
    assert_eq!(experts.load_options().map(|o| o.experts), Ok(ExpertsPlacement::CpuLayers(0..12)));
    assert_eq!(
        f,
        "--devices sim:200,sim:400 --layer-split 15 --kv int8 --max-context 4096 --vram-reserve-mib 0 \
         --conversation-cache-slots 4 --conversation-cache-mib 4096 --threads 2"
    );
    // f32 KV on sim devices (they compute on the CPU): stored as "f32", passed on as `--kv f32`.
    let f32_kv = EngineSettings { kv: KvType::F32, ..s };
    assert_eq!(f32_kv.load_options().map(|o| o.kv_type), Ok(KvType::F32));
    assert!(f32_kv.serve_flags().join(" ").contains("--kv f32 "));
    let json = serde_json::to_value(&f32_kv).unwrap();
    assert_eq!(json["kv"], "f32");
    assert_eq!(serde_json::from_value::<EngineSettings>(json).unwrap(), f32_kv);
}

// Requests at once (`--parallel`): checked, passed on as a flag, and counted in every KV figure.

/// The tiny synthetic llama (2 layers, 4 KV heads of 32), from memory.
fn tiny_model() -> Arc<GgufFile> {
    let bytes = crate::model::synthetic::SyntheticSpec::default().to_gguf();
    Arc::new(GgufFile::from_bytes(bytes).expect("the synthetic model reads"))
}

fn kv_bytes(p: &Plan) -> u64 {
    p.rows.iter().map(|r| r.kv_device_bytes + r.kv_host_bytes).sum()
}

fn on_sims(parallel: Option<u32>) -> EngineSettings {
    EngineSettings { devices: "sim:200,sim:400".into(), max_context: Some(1024), parallel, ..Default::default() }
}

#[test]
fn the_plan_counts_the_requests_run_at_once() {
    let file = tiny_model();
    let one = on_sims(Some(1)).plan(&file).expect("plan");
    let three = on_sims(Some(3)).plan(&file).expect("plan");
    assert!(kv_bytes(&one) > 0);
    assert_eq!(kv_bytes(&three), 3 * kv_bytes(&one));
    assert_eq!((one.sequences, three.sequences), (1, 3));
    for (r1, r3) in one.rows.iter().zip(&three.rows) {
        assert_eq!(r3.kv_device_bytes, 3 * r1.kv_device_bytes, "{}", r3.device);
        assert_eq!(r3.total_bytes - r3.kv_device_bytes, r1.total_bytes - r1.kv_device_bytes, "the load is shared");
    }
    // None on CPU-computed (sim) devices: the server's default, as many as the host holds up to 4 (the
    // tiny model's KV at 1024 positions is 1 MiB a sequence: any host holds 4).
    let default = on_sims(None).plan(&file).expect("plan");
    assert_eq!(default.sequences, parallel::CPU_PARALLEL_DEFAULT);
    assert_eq!(kv_bytes(&default), parallel::CPU_PARALLEL_DEFAULT as u64 * kv_bytes(&one));
    // With speculative decoding or a GPU stage (emu computes through the CUDA backend) the server runs 1.
    let ngram = EngineSettings { speculative: Speculative::Ngram, ..on_sims(None) };
    assert_eq!(ngram.plan(&file).expect("plan").sequences, 1);
    let gpu = EngineSettings { devices: "emu:256".into(), ..on_sims(None) };
    assert_eq!(gpu.plan(&file).expect("plan").sequences, 1);
}

#[test]
fn requests_at_once_are_checked_and_passed_on_as_a_flag() {
    let e = on_sims(Some(0)).check().unwrap_err();
    assert_eq!(e.field, "parallel");
    assert!(e.message.contains('0') && e.message.contains("between 1 and 256"), "{e}");
    let e = on_sims(Some(300)).check().unwrap_err();
    assert!(e.message.starts_with("300 ") && e.message.contains("between 1 and 256"), "{e}");
    // Speculative decoding runs one at a time, as the CLI says; 1 (or the default) goes with it.
    let draft = Speculative::Draft { model_path: "d.gguf".into() };
    for speculative in [Speculative::Ngram, draft.clone()] {
        let e = EngineSettings { speculative, ..on_sims(Some(2)) }.check().unwrap_err();
        assert_eq!(e.field, "parallel");
        assert!(e.message.contains(SPECULATIVE_ONE_AT_A_TIME), "{e}");
    }
    assert_eq!(EngineSettings { speculative: draft, ..on_sims(Some(1)) }.check(), Ok(()));
    assert_eq!(on_sims(Some(256)).check(), Ok(()));
    let f = on_sims(Some(3)).serve_flags().join(" ");
    assert!(f.contains(" --parallel 3"), "{f}");
    // Stored and read back as a number; settings stored before it read as None.
    let json = serde_json::to_value(on_sims(Some(3))).unwrap();
    assert_eq!(json["parallel"], 3);
    assert_eq!(serde_json::from_value::<EngineSettings>(json).unwrap().parallel, Some(3));
}
