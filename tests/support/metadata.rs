//! A cloud's instance-metadata endpoint, as a test stands one up: an HTTP
//! listener at 169.254.169.254:80 in a network namespace the test made,
//! routed from this host through a veth pair, so that the host reaches it
//! (the control) and a test can show that a sandboxed script does not. It
//! lives as long as the value: dropping it stops the listener and removes
//! the namespace, the pair and the route.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The metadata address.
pub const ADDRESS: &str = "169.254.169.254";

/// The running listener and what was made for it.
pub struct Metadata {
    netns: String,
    link: String,
    server: Option<Child>,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl Metadata {
    /// Stands the endpoint up (needs root); it answers `GET /` with 200.
    pub fn start() -> anyhow::Result<Metadata> {
        let tag = std::process::id() % 100_000;
        let netns = format!("ty-md-{tag}");
        let link = format!("tymd{tag}");
        let mut me = Metadata {
            netns: netns.clone(),
            link: link.clone(),
            server: None,
        };
        ip(&["netns", "add", &netns])?;
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "md0", "netns", &netns,
        ])?;
        ip(&["addr", "add", "169.254.169.1/32", "dev", &link])?;
        ip(&["link", "set", &link, "up"])?;
        ip(&["route", "add", &format!("{ADDRESS}/32"), "dev", &link])?;
        ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{ADDRESS}/32"),
            "dev",
            "md0",
        ])?;
        ip(&["-n", &netns, "link", "set", "md0", "up"])?;
        ip(&[
            "-n",
            &netns,
            "route",
            "add",
            "169.254.169.1/32",
            "dev",
            "md0",
        ])?;
        me.server = Some(
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &netns,
                    "python3",
                    "-m",
                    "http.server",
                    "80",
                ])
                .args(["--bind", ADDRESS])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            let addr = format!("{ADDRESS}:80").parse().expect("an address");
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
                return Ok(me);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("the metadata listener did not start")
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("http://{ADDRESS}/")
    }
}

impl Drop for Metadata {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = ip(&["link", "delete", &self.link]);
        let _ = ip(&["netns", "delete", &self.netns]);
    }
}
