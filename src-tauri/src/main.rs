// The Strata desktop app's entry point (no console window on Windows in release builds).
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    strata_desktop::run();
}
