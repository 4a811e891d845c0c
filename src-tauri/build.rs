//! Tauri's build step, with the app's own commands declared so that each gets an `allow-*` permission
//! (capabilities/default.json grants them; a command not granted there cannot be called by the UI).

fn main() {
    let commands: &'static [&'static str] = strata_commands().leak();
    tauri_build::try_build(
        tauri_build::Attributes::new().app_manifest(tauri_build::AppManifest::new().commands(commands)),
    )
    .expect("tauri build step");
}

/// The commands of `src/commands.rs`, one per line in `commands.txt` (read by the tests too).
fn strata_commands() -> Vec<&'static str> {
    println!("cargo:rerun-if-changed=commands.txt");
    let text = std::fs::read_to_string("commands.txt").expect("commands.txt");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| &*l.to_owned().leak())
        .collect()
}
