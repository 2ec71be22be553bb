//! `gpu-probe`'s command line, on any machine (it is parsed before CUDA is loaded): `--help` and
//! `-h` print the help on stdout and exit 0; a usage error exits 2 with one message on stderr.
#![cfg(feature = "probe")]

use std::process::{Command, Output};

const EXE: &str = env!("CARGO_BIN_EXE_gpu-probe");

fn run(args: &[&str]) -> Output {
    Command::new(EXE).args(args).output().unwrap()
}

#[test]
fn help_goes_to_stdout_with_status_0() {
    for flag in ["--help", "-h"] {
        let out = run(&[flag]);
        let (so, se) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(0), "{flag}: {se}");
        assert!(se.is_empty(), "{flag}: {se}");
        assert!(so.contains("Usage: gpu-probe"), "{flag}: {so}");
        for cmd in ["devices", "register", "bandwidth", "ipc", "kernels"] {
            assert!(so.contains(cmd), "{flag}: {cmd}: {so}");
        }
        assert!(!so.contains("ipc-child"), "{flag}: {so}");
    }
    let out = run(&["register", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("MiB"));
}

#[test]
fn usage_errors_exit_2() {
    for args in [&[][..], &["nonsense"], &["register", "0"], &["ipc", "x"]] {
        let out = run(args);
        let se = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {se}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let se = String::from_utf8_lossy(&run(&["register", "0"]).stderr).into_owned();
    assert!(se.contains("not a positive number of MiB"), "{se}");
}
