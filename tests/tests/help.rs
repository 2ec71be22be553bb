//! The command lines of this crate's binaries (`wire-demo`, `verbs-conformance`): `--help` and
//! `-h` print a help screen on stdout and exit 0, and write nothing (`wire-demo --help` once
//! wrote a pcap named `--help`).

use std::path::PathBuf;
use std::process::Command;

/// A fresh, empty directory for a child's working directory.
fn empty_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("help-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn help_and_h_print_help_and_exit_0() {
    for (exe, name, needle) in [
        (env!("CARGO_BIN_EXE_wire-demo"), "wire-demo", "OUTPUT.pcap"),
        (
            env!("CARGO_BIN_EXE_verbs-conformance"),
            "verbs-conformance",
            "--link",
        ),
    ] {
        for flag in ["--help", "-h"] {
            let dir = empty_dir(&format!("{name}{flag}"));
            let out = Command::new(exe)
                .arg(flag)
                .current_dir(&dir)
                .output()
                .unwrap();
            let (so, se) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            assert_eq!(out.status.code(), Some(0), "{name} {flag}: {se}");
            assert!(
                so.contains(&format!("Usage: {name}")) && so.contains(needle),
                "{name} {flag}: {so}"
            );
            let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
            assert!(left.is_empty(), "{name} {flag} wrote {left:?}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// A flag wire-demo does not know is a usage error (exit 2), not a file name.
#[test]
fn wire_demo_refuses_unknown_flags() {
    let dir = empty_dir("wire-demo-bad-flag");
    let out = Command::new(env!("CARGO_BIN_EXE_wire-demo"))
        .arg("--no-such-flag")
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
