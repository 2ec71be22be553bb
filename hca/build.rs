//! Builds the AF_XDP link's XDP program (`xdp/roce_redirect.bpf.c`) into
//! `$OUT_DIR/roce_redirect.bpf.o` with clang's BPF target (`clang -O2 -g -target bpf`; the
//! compiler is `$CLANG`, else the first of `clang`, `clang-14` .. `clang-19` on `PATH`; the
//! headers are libbpf-dev's). Without a compiler or headers the object is left empty and the
//! link's open fails with a message naming this (`XdpError::ProgramNotBuilt`); the rest of the
//! crate builds as before.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = "xdp/roce_redirect.bpf.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join("roce_redirect.bpf.o");
    let wanted = env::var_os("CARGO_FEATURE_STD").is_some()
        && env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if wanted {
        match compile(&object) {
            Ok(()) => return,
            Err(why) => println!(
                "cargo:warning=the AF_XDP link's XDP program was not built ({why}); \
                 install clang and libbpf-dev (tests/setup.sh does) for `--link xdp:`"
            ),
        }
    }
    std::fs::write(&object, b"").expect("write the empty XDP object");
}

fn compile(object: &Path) -> Result<(), String> {
    let candidates: Vec<String> = match env::var("CLANG") {
        Ok(c) => vec![c],
        Err(_) => [
            "clang", "clang-14", "clang-15", "clang-16", "clang-17", "clang-18", "clang-19",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect(),
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    // Debian keeps <asm/types.h> under the target's multiarch directory.
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    for clang in &candidates {
        let mut cmd = Command::new(clang);
        cmd.args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"]);
        if Path::new(&multiarch).is_dir() {
            cmd.arg(format!("-I{multiarch}"));
        }
        cmd.args(["-c", SOURCE, "-o"]).arg(object);
        match cmd.output() {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => {
                return Err(format!(
                    "{clang} failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
            Err(_) => continue,
        }
    }
    Err("no clang found".to_string())
}
