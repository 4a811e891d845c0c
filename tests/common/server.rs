//! A `strata serve` child process for the server tests, and a small HTTP/1.1 client over a raw TCP stream
//! (raw so that tests can send what no well-behaved client sends: bad bytes, slow headers, early hang-ups).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running server; killed when dropped.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    stderr: Arc<Mutex<String>>,
}

/// One HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .map(str::to_owned)
            .collect()
    }

    /// Asserts an OpenAI error body with this status, returning the error object.
    pub fn expect_error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e
    }
}

impl Server {
    /// Starts `strata serve --port 0 -t 2` with `args`; waits for its first stdout line (the port).
    pub fn start(args: &[&str]) -> Server {
        Self::start_env(args, &[])
    }

    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_in(None, args, env)
    }

    /// Starts the server with `dir` as its working directory (None: the test's).
    pub fn start_in(dir: Option<&std::path::Path>, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
        if let Some(d) = dir {
            cmd.current_dir(d);
        }
        cmd.args(["serve", "--port", "0", "-t", "2"]).args(args);
        if !args.contains(&"-m") {
            cmd.arg("-m").arg(super::model_path());
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("strata serve starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).expect("reads the first stdout line");
        let port = line
            .trim()
            .strip_prefix("strata serve: listening on http://")
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                let _ = child.wait();
                panic!("no listening line: {line:?}; stderr: {}", stderr.lock().unwrap())
            });
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
        });
        Server { child: Some(child), port, stderr }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Whether the server's log says `text` within 10 s (its log lines come on their own thread, and a
    /// request's stats line may be written after its answer was sent).
    pub fn logs(&self, text: &str) -> bool {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if self.stderr().contains(text) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Resident memory of the server, KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("connects");
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        s
    }

    /// Sends raw bytes and reads the response to the end (the request should say Connection: close).
    pub fn raw(&self, bytes: &[u8]) -> Resp {
        let mut s = self.connect();
        s.write_all(bytes).expect("writes");
        read_response(&mut s)
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let json = (!body.is_empty() || method == "POST").then_some(("application/json", body));
        self.send(method, path, &format!("127.0.0.1:{}", self.port), headers, json)
    }

    /// A request as a browser page or another host would send it: this `Host`, these headers, and a body
    /// with its Content-Type (an empty type sends none).
    pub fn send(
        &self,
        method: &str,
        path: &str,
        host: &str,
        headers: &[(&str, &str)],
        body: Option<(&str, &[u8])>,
    ) -> Resp {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some((content_type, body)) = body {
            if !content_type.is_empty() {
                req.push_str(&format!("Content-Type: {content_type}\r\n"));
            }
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body.map_or(&[][..], |(_, b)| b));
        self.raw(&bytes)
    }

    pub fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        self.request("POST", path, &[], body.to_string().as_bytes())
    }

    pub fn get_auth(&self, path: &str, key: &str) -> Resp {
        self.request("GET", path, &[("Authorization", &format!("Bearer {key}"))], b"")
    }

    pub fn post_auth(&self, path: &str, key: &str, body: &Value) -> Resp {
        self.request("POST", path, &[("Authorization", &format!("Bearer {key}"))], body.to_string().as_bytes())
    }

    /// SIGTERM, then waits (at most 60 s) for the exit.
    pub fn stop(mut self) -> ExitStatus {
        let child = self.child.as_mut().unwrap();
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        self.wait(Duration::from_secs(60))
    }

    /// Waits for the process to exit by itself.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let child = self.child.as_mut().unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return st;
            }
            if t0.elapsed() > limit {
                let _ = child.kill();
                panic!("the server did not exit within {limit:?}; stderr: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Reads one response (to the end of the stream), decoding a chunked body.
pub fn read_response(s: &mut TcpStream) -> Resp {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw).unwrap_or_else(|| panic!("not an HTTP response: {:?}", String::from_utf8_lossy(&raw)))
}

pub fn parse_response(raw: &[u8]) -> Option<Resp> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned())).collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked =
        headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..nl]).ok()?.trim(), 16).ok()?;
            rest = &rest[nl + 2..];
            if size == 0 || rest.len() < size {
                out.extend_from_slice(&rest[..size.min(rest.len())]);
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[(size + 2).min(rest.len())..];
        }
        body = out;
    }
    Some(Resp { status, headers, body })
}

/// A chat request body: one user message, greedy, `max_tokens`.
pub fn chat_body(user: &str, max_tokens: usize) -> Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}

/// The text of a streamed chat reply, and its chunks.
pub fn streamed_text(r: &Resp) -> (String, Vec<Value>) {
    assert_eq!(r.status, 200, "{}", r.text());
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{}", r.text());
    let chunks: Vec<Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("a JSON chunk")).collect();
    let mut text = String::new();
    for c in &chunks {
        for ch in c["choices"].as_array().unwrap() {
            if let Some(t) = ch["delta"]["content"].as_str().or_else(|| ch["text"].as_str()) {
                text.push_str(t);
            }
        }
    }
    (text, chunks)
}
