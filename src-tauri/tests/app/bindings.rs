//! The TypeScript declarations in ui/src/bindings/ are generated from the Rust types by ts-rs; this test
//! fails when they are stale. `STRATA_BLESS=1 cargo test --release -p strata-desktop --test app bindings` rewrites them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ts_rs::{Config, TS};

fn export_all(dir: &Path) {
    let cfg = Config::new().with_large_int("number").with_out_dir(dir);
    macro_rules! export {
        ($($t:ty),* $(,)?) => { $( <$t>::export_all(&cfg).unwrap_or_else(|e| panic!("{}: {e}", stringify!($t))); )* };
    }
    use strata::hub::library::{DownloadView, FileView, FitView, Pick};
    use strata::hub::local::LocalModel;
    use strata::hub::HubModel;
    use strata::plan::facts::ModelFacts;
    use strata::plan::settings::{EngineSettings, FieldError, PlanReply};
    use strata::server::state::CacheView;
    use strata::server::status::{DevicesView, TelemetryView};
    use strata::telemetry::{Entry, Event};
    use strata_desktop::types::*;
    export!(
        ModelFacts,
        EngineSettings,
        FieldError,
        PlanReply,
        CacheView,
        DevicesView,
        TelemetryView,
        Entry,
        Event,
        ChatMessage,
        ChatParams,
        ChatPreferences,
        ChatChunk,
        Conversation,
        ConversationSummary,
        ExportFormat,
        EngineStatus,
        LoadProgress,
        CommandError,
        HubModel,
        FileView,
        FitView,
        Pick,
        DownloadView,
        LocalModel,
    );
    // One module that re-exports every type, for `import type { X } from "../bindings"`.
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".ts").map(str::to_owned))
        .filter(|n| n != "index")
        .collect();
    names.sort();
    let index: String = names.iter().map(|n| format!("export type {{ {n} }} from \"./{n}\";\n")).collect();
    std::fs::write(dir.join("index.ts"), index).unwrap();
}

fn read_dir(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| {
                let e = e.ok()?;
                Some((e.file_name().to_string_lossy().into_owned(), std::fs::read_to_string(e.path()).ok()?))
            })
            .collect()
        })
        .unwrap_or_default()
}

#[test]
fn typescript_bindings_are_current() {
    let committed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ui/src/bindings");
    let fresh = tempfile::tempdir().unwrap();
    export_all(fresh.path());
    let want = read_dir(fresh.path());
    assert!(want.len() > 20, "ts-rs exported only {} files", want.len());
    if std::env::var_os("STRATA_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&committed);
        std::fs::create_dir_all(&committed).unwrap();
        for (name, text) in &want {
            std::fs::write(committed.join(name), text).unwrap();
        }
        return;
    }
    let have = read_dir(&committed);
    let stale: Vec<&String> = want.keys().filter(|k| have.get(*k) != want.get(*k)).collect();
    let extra: Vec<&String> = have.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        stale.is_empty() && extra.is_empty(),
        "ui/src/bindings is stale: changed or missing {stale:?}, not generated {extra:?}; run \
         STRATA_BLESS=1 cargo test --release -p strata-desktop --test app bindings"
    );
}
