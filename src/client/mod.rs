//! A blocking HTTP client for the API, used by the command line (`berth topic|produce|consume|ack|...`) and by the
//! end-to-end tests. Every answer, success or error, comes back as status + headers + body.

use std::time::Duration;

/// An answer from the server.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A keep-alive connection pool to one server.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    token: Option<String>,
}

impl Client {
    /// `base` like `http://127.0.0.1:7070` (or `https://...`: the server's certificate is then checked against the
    /// public CAs, or against `with_ca_file`'s).
    pub fn new(base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            agent: agent(None),
            token: None,
        }
    }

    /// HTTPS with the CA certificate(s) in `ca` (PEM) as the only ones trusted, as `curl --cacert` does.
    pub fn with_ca_file(self, ca: &std::path::Path) -> Result<Client, String> {
        let tls = crate::tls::client_config(ca, Some(crate::tls::ALPN_HTTP), None)?;
        Ok(Client {
            agent: agent(Some(tls)),
            ..self
        })
    }

    /// Sends `Authorization: Bearer TOKEN` with every request.
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token;
        self
    }

    /// Sends a request; `path_and_query` starts with '/'. Transport failures are `Err`; HTTP errors are answers.
    pub fn call(&self, method: &str, path_and_query: &str, body: &[u8]) -> Result<Answer, String> {
        self.call_with(method, path_and_query, &[], body)
    }

    /// `call` with extra headers (`Content-Type`, `Accept`).
    pub fn call_with(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Answer, String> {
        let url = format!("{}{}", self.base, path_and_query);
        let mut request = self.agent.request(method, &url);
        for (name, value) in headers {
            request = request.set(name, value);
        }
        if let Some(token) = &self.token {
            request = request.set("authorization", &format!("Bearer {token}"));
        }
        let result = if method == "GET" || method == "DELETE" {
            request.call()
        } else {
            request.send_bytes(body)
        };
        let response = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => {
                return Err(format!("{method} {url}: {}", transport_error(&t)))
            }
        };
        let status = response.status();
        let headers = response
            .headers_names()
            .into_iter()
            .filter_map(|n| response.header(&n).map(|v| (n.clone(), v.to_string())))
            .collect();
        let mut body = Vec::new();
        use std::io::Read;
        response
            .into_reader()
            .take(512 << 20)
            .read_to_end(&mut body)
            .map_err(|e| format!("{method} {url}: reading the body: {e}"))?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

fn agent(tls: Option<std::sync::Arc<rustls::ClientConfig>>) -> ureq::Agent {
    let mut builder = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(5))
        .timeout(Duration::from_secs(90))
        .max_idle_connections_per_host(64);
    if let Some(tls) = tls {
        builder = builder.tls_config(tls);
    }
    builder.build()
}

/// Percent-encodes a query value.
pub fn enc(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// A transport error without the URL ureq's `Display` puts first (the caller's message names it already): its
/// kind, message and cause, e.g. "Connection Failed: Connect error: Connection refused (os error 111)".
fn transport_error(t: &ureq::Transport) -> String {
    let mut why = t.kind().to_string();
    if let Some(message) = t.message() {
        why.push_str(": ");
        why.push_str(message);
    }
    if let Some(source) = std::error::Error::source(t) {
        why.push_str(": ");
        why.push_str(&source.to_string());
    }
    why
}
