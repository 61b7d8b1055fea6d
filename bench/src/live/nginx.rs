//! nginx as a round-robin reverse proxy, for side-by-side overhead measurements.
//!
//! The config (written to a private temp dir with every path nginx writes inside it):
//! `worker_processes auto`, access log off, an `upstream` block with the given servers
//! (round robin) and `keepalive 128`, `proxy_http_version 1.1` with an empty
//! `Connection` header (upstream keep-alive), `proxy_buffering off` (tokens stream
//! through), and `keepalive_requests` raised on both sides so that nginx, like our
//! router, never closes a busy connection. nginx comes from Debian's `nginx` package:
//! `scripts/install-nginx.sh` installs it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::LiveError;
use super::procs::{ChildProc, free_port, wait_ready};

/// The nginx binary on PATH or in /usr/sbin.
pub fn find_nginx() -> Option<PathBuf> {
    let mut places: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("nginx")).collect())
        .unwrap_or_default();
    places.push(PathBuf::from("/usr/sbin/nginx"));
    places.into_iter().find(|p| p.is_file())
}

/// The config text for a proxy on `listen` in front of `upstreams`, rooted at `dir`.
pub fn config(listen: SocketAddr, upstreams: &[SocketAddr], dir: &Path) -> String {
    let d = dir.display();
    let servers: String = upstreams
        .iter()
        .map(|u| format!("        server {u};\n"))
        .collect();
    format!(
        "worker_processes auto;\n\
         daemon off;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   client_body_temp_path {d}/client_body;\n\
         \x20   proxy_temp_path {d}/proxy;\n\
         \x20   fastcgi_temp_path {d}/fastcgi;\n\
         \x20   uwsgi_temp_path {d}/uwsgi;\n\
         \x20   scgi_temp_path {d}/scgi;\n\
         \x20   keepalive_requests 10000000;\n\
         \x20   upstream backends {{\n\
         {servers}\
         \x20       keepalive 128;\n\
         \x20       keepalive_requests 10000000;\n\
         \x20   }}\n\
         \x20   server {{\n\
         \x20       listen {listen};\n\
         \x20       location = /health {{ return 200; }}\n\
         \x20       location / {{\n\
         \x20           proxy_pass http://backends;\n\
         \x20           proxy_http_version 1.1;\n\
         \x20           proxy_set_header Connection \"\";\n\
         \x20           proxy_buffering off;\n\
         \x20       }}\n\
         \x20   }}\n\
         }}\n"
    )
}

/// A running nginx (master and workers) and its temp dir.
#[derive(Debug)]
pub struct Nginx {
    pub proc: ChildProc,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Nginx {
    pub async fn stop(&mut self) {
        self.proc.stop(Duration::from_secs(5)).await;
    }
}

/// Starts `bin` as a round-robin proxy in front of `upstreams` on a loopback port.
pub async fn start_nginx(
    bin: &Path,
    upstreams: &[SocketAddr],
    timeout: Duration,
) -> Result<Nginx, LiveError> {
    let dir = tempfile::Builder::new()
        .prefix("headroom-nginx-")
        .tempdir()
        .map_err(|e| LiveError::io("nginx temp dir", e))?;
    let mut last = None;
    for _ in 0..3 {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, config(addr, upstreams, dir.path()))
            .map_err(|e| LiveError::io("writing nginx.conf", e))?;
        let args = vec![
            "-p".to_string(),
            dir.path().display().to_string(),
            "-e".into(),
            dir.path().join("error.log").display().to_string(),
            "-c".into(),
            conf.display().to_string(),
        ];
        let mut proc = ChildProc::spawn("nginx", bin, &args, None, &[])?;
        proc.drain_stdout();
        match wait_ready(addr, "/health", timeout, Some(&mut proc)).await {
            Ok(()) => {
                return Ok(Nginx {
                    proc,
                    addr,
                    _dir: dir,
                });
            }
            Err(e) => {
                proc.stop(Duration::from_secs(2)).await;
                let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                last = Some(LiveError::Startup {
                    what: "nginx".into(),
                    why: format!("{e}; error.log: {}", log.trim()),
                });
            }
        }
    }
    Err(last.unwrap_or_else(|| LiveError::Startup {
        what: "nginx".into(),
        why: "no attempt made".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_every_upstream_and_streams() {
        let ups: Vec<SocketAddr> = vec![
            "127.0.0.1:9001".parse().expect("addr"),
            "127.0.0.1:9002".parse().expect("addr"),
        ];
        let c = config(
            "127.0.0.1:8000".parse().expect("addr"),
            &ups,
            Path::new("/tmp/x"),
        );
        assert!(c.contains("server 127.0.0.1:9001;") && c.contains("server 127.0.0.1:9002;"));
        assert!(c.contains("listen 127.0.0.1:8000;"));
        assert!(c.contains("proxy_buffering off;") && c.contains("proxy_http_version 1.1;"));
        assert!(c.contains("pid /tmp/x/nginx.pid;"));
        assert_eq!(c.matches('{').count(), c.matches('}').count());
    }
}
