//! The repository's own scripts: the checks `scripts/test` makes before it
//! builds (a fresh machine must be told what to install, not fail in a build).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `libclang_found DIR` from `scripts/lib/deps.sh` over a directory that
/// holds exactly `files`.
fn libclang_found_among(files: &[&str]) -> bool {
    let dir = tempfile::tempdir().unwrap();
    for file in files {
        std::fs::write(dir.path().join(file), b"").unwrap();
    }
    let status = Command::new("bash")
        .arg("-c")
        .arg(". scripts/lib/deps.sh && libclang_found \"$1\"")
        .arg("libclang_found")
        .arg(dir.path())
        .current_dir(repository())
        .status()
        .expect("bash runs");
    status.success()
}

#[test]
fn libclang_cpp_alone_is_not_libclang() {
    assert!(!libclang_found_among(&["libclang-cpp.so.14"]));
    assert!(!libclang_found_among(&["libclang-cpp.so", "libclangBasic.a"]));
    assert!(!libclang_found_among(&[]));
}

#[test]
fn the_libclang_bindgen_loads_is_found() {
    assert!(libclang_found_among(&["libclang-14.so.1"]));
    assert!(libclang_found_among(&["libclang-cpp.so.14", "libclang-14.so.1"]));
    assert!(libclang_found_among(&["libclang.so"]));
    assert!(libclang_found_among(&["libclang.so.17"]));
    assert!(libclang_found_among(&["libclang-16.so"]));
}
