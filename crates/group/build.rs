//! Builds the kernel data path's XDP program (bpf/group.bpf.c) with clang, when clang can.
//!
//! Without clang, or without the BPF headers (libbpf-dev), the crate still builds: the object
//! is absent, a cargo warning says why, and at run time the kernel data path reports "not
//! built: ..." and every host falls back to the user-space path. scripts/test.sh installs
//! clang and libbpf-dev (as root) before `cargo test`; a missing clang makes this script run
//! again on every build, so the object appears as soon as the tools do.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: [&str; 2] = ["bpf/group.bpf.c", "bpf/group.h"];

fn main() {
    for source in SOURCES {
        println!("cargo:rerun-if-changed={source}");
    }
    println!("cargo:rerun-if-env-changed=CHORUS_BPF_CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join("group.bpf.o");
    let outcome = compile(&object);
    let generated = match &outcome {
        Ok(()) => format!(
            "/// The compiled XDP object.\npub const OBJECT: Result<&[u8], &str> = Ok(aya::include_bytes_aligned!({:?}));\n",
            object.display().to_string()
        ),
        Err(reason) => {
            println!("cargo:warning=chorus-group: the kernel data path is not built: {reason}");
            format!("/// Why the XDP object is absent.\npub const OBJECT: Result<&[u8], &str> = Err({reason:?});\n")
        }
    };
    std::fs::write(out.join("bpf_object.rs"), generated).expect("writing bpf_object.rs");
}

fn compile(object: &Path) -> Result<(), String> {
    let clang = env::var("CHORUS_BPF_CLANG").unwrap_or_else(|_| "clang".to_string());
    let Some(clang_path) = find_program(&clang) else {
        rerun_until_found();
        return Err(format!(
            "clang missing ({clang} not found; scripts/test.sh installs clang and libbpf-dev)"
        ));
    };
    println!("cargo:rerun-if-changed={}", clang_path.display());
    let headers = ["/usr/include/bpf/bpf_helpers.h", "/usr/include/linux/bpf.h"];
    if let Some(missing) = headers.iter().find(|header| !Path::new(header).exists()) {
        rerun_until_found();
        return Err(format!("{missing} missing (install libbpf-dev and linux-libc-dev)"));
    }
    let arch_include =
        format!("/usr/include/{}-linux-gnu", env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default());
    let output = Command::new(&clang_path)
        .args(["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror"])
        .arg(format!("-I{arch_include}"))
        .args(["-c", "bpf/group.bpf.c", "-o"])
        .arg(object)
        .output()
        .map_err(|e| format!("running {}: {e}", clang_path.display()))?;
    // With clang present, a program that does not compile is a bug, not a missing tool.
    assert!(
        output.status.success(),
        "clang could not compile bpf/group.bpf.c:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Run this script again on every build until the tools are there: a path that never exists
/// is always stale to cargo. (Naming the tool's own path would not do: a package installs it
/// with an old modification time, which cargo would take for "unchanged".)
fn rerun_until_found() {
    println!("cargo:rerun-if-changed=bpf/.rerun-until-clang-and-headers-are-found");
}

fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|path| path.exists());
    }
    env::split_paths(&env::var_os("PATH")?).map(|dir| dir.join(name)).find(|path| path.is_file())
}
