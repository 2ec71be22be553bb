//! What the test binaries of this crate share: the directory holding the built library as
//! `libibverbs.so.1`, the Debian tools they run, and their output as text.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

/// A directory of its own holding a `libibverbs.so.1` link to the built `libibverbs.so` (in the
/// test binary's `target/PROFILE/deps/`, or `target/PROFILE/` after `cargo build`).
pub fn lib_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(make_lib_dir).clone()
}

/// The profile directory (`target/PROFILE`) holding both drop-in libraries with their SONAME
/// links, `libibverbs.so.1` and `librdmacm.so.1`, built once per test binary by `cargo build -p
/// ibverbs-abi -p rdmacm-abi` (`cargo test` does not build the librdmacm cdylib for this crate's
/// tests). Panics when the build fails or a library is missing afterwards.
pub fn both_libraries() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/PROFILE/deps/TEST")
            .to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "-q", "-p", "ibverbs-abi", "-p", "rdmacm-abi"]);
        if profile.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p ibverbs-abi -p rdmacm-abi failed"
        );
        for so in ["libibverbs.so.1", "librdmacm.so.1"] {
            assert!(
                profile.join(so).exists(),
                "{so} not in {}",
                profile.display()
            );
        }
        profile
    })
    .clone()
}

fn make_lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/PROFILE/deps/TEST");
    // `cargo test` leaves the library it builds for the tests in deps/ (only `cargo build` copies
    // it up to target/PROFILE).
    let so = [
        profile.join("deps/libibverbs.so"),
        profile.join("libibverbs.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("libibverbs.so not built under {}", profile.display()));
    let dir = profile.join("abi-test-lib");
    std::fs::create_dir_all(&dir).expect("create lib dir");
    let link = dir.join("libibverbs.so.1");
    // Another test binary of this build may have made it already (same target).
    let tmp = dir.join(format!("libibverbs.so.1.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&so, &tmp).expect("symlink libibverbs.so.1");
    std::fs::rename(&tmp, &link).expect("install the link atomically");
    dir
}

pub fn tool(name: &str) -> Option<PathBuf> {
    let p = Path::new("/usr/bin").join(name);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("ROCE_SKIP_DEBIAN_TOOLS").is_ok_and(|v| v == "1") {
        eprintln!("{name} is not installed; skipped because ROCE_SKIP_DEBIAN_TOOLS=1");
        return None;
    }
    panic!(
        "{name} is not installed (ibverbs-utils / perftest): run `bash tests/setup.sh` as root \
         (or set ROCE_SKIP_DEBIAN_TOOLS=1)"
    );
}

/// stdout and stderr of `o`, as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
