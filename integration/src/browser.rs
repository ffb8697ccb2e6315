//! Headless Chromium driven over W3C WebDriver, for the dashboard's
//! browser test.
//!
//! A client of its own (a dozen endpoints over the workspace's hyper)
//! rather than a WebDriver crate: the test needs sessions, navigation,
//! `execute/sync`, element clicks and a screenshot, and the crates that
//! offer more would add about twenty crates (an ICU text segmenter among
//! them) to the workspace for it.
//!
//! [`Browser::for_test`] finds Debian's `chromium` and `chromium-driver`
//! (`apt-get install chromium chromium-driver`): missing, the test skips
//! and says so, unless `GPUSLICE_REQUIRE_BROWSER=1` (CI), which turns the
//! skip into a failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Why a browser step failed.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    /// chromedriver could not be started or did not become ready.
    #[error("chromedriver: {0}")]
    Driver(String),
    /// A WebDriver request failed or answered an error.
    #[error("webdriver {command}: {message}")]
    Command {
        /// The endpoint.
        command: String,
        /// What went wrong.
        message: String,
    },
}

type Result<T, E = BrowserError> = std::result::Result<T, E>;

/// Chromium and its driver, as installed.
#[derive(Debug, Clone)]
pub struct Browser {
    /// The `chromium` executable.
    pub chromium: PathBuf,
    /// The `chromedriver` executable.
    pub chromedriver: PathBuf,
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

impl Browser {
    /// Finds Chromium (the real binary behind Debian's wrapper script,
    /// else `chromium` on the PATH) and `chromedriver` on the PATH.
    ///
    /// # Errors
    /// What is missing.
    pub fn find() -> Result<Self, String> {
        let chromium = [PathBuf::from("/usr/lib/chromium/chromium")]
            .into_iter()
            .find(|p| p.is_file())
            .or_else(|| on_path("chromium"))
            .or_else(|| on_path("chromium-browser"));
        let chromedriver = on_path("chromedriver");
        match (chromium, chromedriver) {
            (Some(chromium), Some(chromedriver)) => Ok(Self {
                chromium,
                chromedriver,
            }),
            (c, d) => Err([
                c.is_none().then_some("chromium"),
                d.is_none().then_some("chromedriver"),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" and ")),
        }
    }

    /// The browser for a test: found, or `None` after printing why the test
    /// skips. With `GPUSLICE_REQUIRE_BROWSER` set (CI installs Chromium
    /// first), a missing browser fails the test instead.
    ///
    /// # Panics
    /// It is missing and the variable is set.
    #[must_use]
    pub fn for_test(test: &str) -> Option<Self> {
        match Self::find() {
            Ok(b) => Some(b),
            Err(missing) if std::env::var_os("GPUSLICE_REQUIRE_BROWSER").is_some() => {
                panic!("{test}: GPUSLICE_REQUIRE_BROWSER is set but {missing} is not installed")
            }
            Err(missing) => {
                eprintln!(
                    "SKIPPED {test}: {missing} not found; install them with \
                     `apt-get install -y chromium chromium-driver` to run it"
                );
                None
            }
        }
    }

    /// Starts chromedriver on a free loopback port and opens a headless
    /// session of `width` × `height`.
    ///
    /// # Errors
    /// The driver did not start or refused the session.
    pub async fn start(&self, width: u32, height: u32) -> Result<Session> {
        let port = crate::real::control_plane::free_port()
            .map_err(|e| BrowserError::Driver(e.to_string()))?;
        let child = Command::new(&self.chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| BrowserError::Driver(format!("{}: {e}", self.chromedriver.display())))?;
        let mut driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            client: Client::builder(TokioExecutor::new()).build_http(),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match driver.call("GET", "/status", None).await {
                Ok(status) if status["ready"] == true => break,
                _ if tokio::time::Instant::now() > deadline => {
                    return Err(BrowserError::Driver("not ready after 20 s".to_owned()));
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": self.chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--hide-scrollbars",
                    format!("--window-size={width},{height}"),
                ],
            },
        }}});
        let session = driver.call("POST", "/session", Some(capabilities)).await?;
        let id = session["sessionId"]
            .as_str()
            .ok_or_else(|| BrowserError::Driver(format!("no sessionId in {session}")))?
            .to_owned();
        driver.base = format!("{}/session/{id}", driver.base);
        Ok(Session { driver })
    }
}

struct Driver {
    child: Child,
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Driver {
    /// One WebDriver call; the answer's `value`.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let failed = |message: String| BrowserError::Command {
            command: format!("{method} {path}"),
            message,
        };
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| failed(e.to_string()))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| failed(e.to_string()))?
            .to_bytes();
        let mut value: Value =
            serde_json::from_slice(&bytes).map_err(|e| failed(format!("{status}: {e}")))?;
        if !status.is_success() {
            return Err(failed(format!("{status}: {}", value["value"])));
        }
        Ok(value["value"].take())
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An open browser session; chromedriver (and its Chromium) stop when it
/// is dropped.
pub struct Session {
    driver: Driver,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("base", &self.driver.base)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens `url`.
    ///
    /// # Errors
    /// The navigation failed.
    pub async fn goto(&self, url: &str) -> Result<()> {
        self.driver
            .call("POST", "/url", Some(json!({ "url": url })))
            .await
            .map(drop)
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the
    /// page and returns what it returns.
    ///
    /// # Errors
    /// The script threw or the call failed.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.driver
            .call(
                "POST",
                "/execute/sync",
                Some(json!({ "script": script, "args": args })),
            )
            .await
    }

    /// Clicks the first element matching the CSS `selector`, as a user
    /// would (the driver scrolls it into view and clicks its centre).
    ///
    /// # Errors
    /// No such element, or it cannot be clicked.
    pub async fn click(&self, selector: &str) -> Result<()> {
        let found = self
            .driver
            .call(
                "POST",
                "/element",
                Some(json!({ "using": "css selector", "value": selector })),
            )
            .await?;
        let id = found[ELEMENT]
            .as_str()
            .ok_or_else(|| BrowserError::Command {
                command: format!("find {selector}"),
                message: format!("no element reference in {found}"),
            })?;
        self.driver
            .call("POST", &format!("/element/{id}/click"), Some(json!({})))
            .await
            .map(drop)
    }

    /// A PNG of the window.
    ///
    /// # Errors
    /// The call failed or the answer is not base64.
    pub async fn screenshot(&self) -> Result<Vec<u8>> {
        let png = self.driver.call("GET", "/screenshot", None).await?;
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .map_err(|e| BrowserError::Command {
                command: "screenshot".to_owned(),
                message: e.to_string(),
            })
    }

    /// Ends the session (Chromium exits), then the driver.
    pub async fn quit(self) {
        let _ = self.driver.call("DELETE", "", None).await;
    }
}
