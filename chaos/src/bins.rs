//! Finding the processes under test: the `headroom` router and the `headroom-replica`
//! emulator.
//!
//! Lookup order for each binary: an explicit directory (`--bin-dir`), the env var
//! naming the file (`HEADROOM_BIN`, `HEADROOM_REPLICA_BIN`), `HEADROOM_BIN_DIR`,
//! cargo's `CARGO_BIN_EXE_<name>`, then next to the running executable and one level
//! up (cargo puts test executables in `target/<profile>/deps/`). Nothing is ever built
//! here: a missing binary is an error that names the exact cargo command to run.

use std::path::{Path, PathBuf};

use crate::ChaosError;

/// Paths of the binaries a scenario starts.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub headroom: PathBuf,
    pub replica: PathBuf,
}

impl Binaries {
    /// Finds both binaries (see the module docs for the order).
    pub fn find(dir: Option<&Path>) -> Result<Binaries, ChaosError> {
        Ok(Binaries {
            headroom: find_one("headroom", "HEADROOM_BIN", dir)?,
            replica: find_one("headroom-replica", "HEADROOM_REPLICA_BIN", dir)?,
        })
    }
}

/// The cargo profile the running executable was built with, as a flag.
fn profile_flag() -> &'static str {
    let release = std::env::current_exe()
        .ok()
        .is_some_and(|p| p.components().any(|c| c.as_os_str() == "release"));
    if release { " --release" } else { "" }
}

/// The command that builds what the scenarios need.
pub fn build_command() -> String {
    format!(
        "cargo build{} -p headroom -p headroom-replica --bin headroom --bin headroom-replica",
        profile_flag()
    )
}

fn find_one(name: &str, env_file: &str, dir: Option<&Path>) -> Result<PathBuf, ChaosError> {
    let mut places: Vec<PathBuf> = Vec::new();
    if let Some(d) = dir {
        places.push(d.join(name));
    } else {
        if let Some(p) = std::env::var_os(env_file) {
            places.push(PathBuf::from(p));
        }
        if let Some(d) = std::env::var_os("HEADROOM_BIN_DIR") {
            places.push(Path::new(&d).join(name));
        }
        if let Some(p) = std::env::var_os(format!("CARGO_BIN_EXE_{name}")) {
            places.push(PathBuf::from(p));
        }
        if let Ok(me) = std::env::current_exe()
            && let Some(d) = me.parent()
        {
            places.push(d.join(name));
            places.push(d.join("..").join(name));
        }
    }
    if let Some(found) = places.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
    Err(ChaosError::MissingBinary(format!(
        "`{name}` not found (looked in: {}); build it with `{}` (same --target-dir as this \
         executable), or point {env_file} / HEADROOM_BIN_DIR at it",
        if looked.is_empty() {
            "nowhere".to_string()
        } else {
            looked.join(", ")
        },
        build_command()
    )))
}
