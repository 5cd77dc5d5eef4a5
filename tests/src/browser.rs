//! Headless Chromium (Debian's `chromium`, installed by `cargo xtask setup`) as the deploy
//! page's reader: the DOM after the page's scripts ran, and a screenshot.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// The browser binary: `DRAINWATCH_CHROMIUM`, else Debian's `/usr/bin/chromium`.
pub fn chromium() -> PathBuf {
    let path = std::env::var_os("DRAINWATCH_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.exists(),
        "{} is missing: `cargo xtask setup` installs Debian's chromium",
        path.display()
    );
    path
}

/// Runs headless Chromium on `url` with `args`, bounded by `timeout`: its stdout.
fn run(url: &str, args: &[&str], timeout: Duration) -> Result<String, String> {
    // A profile of its own: two runs never share (or lock) one.
    let profile = std::env::temp_dir().join(format!(
        "drainwatch-chromium-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            // Root cannot use Chromium's sandbox; the page is our own, on loopback.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", chromium().display()))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&profile);
            return Err(format!("chromium did not finish within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = std::fs::remove_dir_all(&profile);
    if status.success() {
        Ok(out)
    } else {
        Err(format!("chromium failed ({status}): {err}"))
    }
}

/// The DOM of `url` once loaded, serialized (`--dump-dom`).
pub fn dump_dom(url: &str) -> Result<String, String> {
    run(url, &["--dump-dom"], Duration::from_secs(90))
}

/// Saves a `width` × `height` screenshot of `url` to `path` (PNG).
pub fn screenshot(url: &str, path: &Path, width: u32, height: u32) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let shot = format!("--screenshot={}", path.display());
    let size = format!("--window-size={width},{height}");
    run(url, &[&shot, &size], Duration::from_secs(90))?;
    match png_size(path) {
        Some(_) => Ok(()),
        None => Err(format!("{} is not a PNG", path.display())),
    }
}

/// Width and height from a PNG's IHDR chunk.
pub fn png_size(path: &Path) -> Option<(u32, u32)> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < 24 || &bytes[..8] != b"\x89PNG\r\n\x1a\n" || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let be = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    Some((be(16), be(20)))
}

/// How Chromium serializes a text node: `&`, `<`, `>` escaped, quotes left alone.
pub fn dom_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\u{a0}', "&nbsp;")
}
