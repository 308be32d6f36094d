//! The command line: `berth serve` runs the broker; `berth bench` is the load generator; the other commands are a
//! client for people at a terminal. Part of the binary only: the server library links none of it.

pub mod bench;

use berth::client::{enc, Answer, Client};
use berth::config::{Config, FsyncPolicy};
use clap::{Args, Parser, Subcommand};
use std::io::{Read, Write};
use std::path::PathBuf;

/// Where client commands go by default (the serve default).
const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";

#[derive(Parser, Debug)]
#[command(
    name = "berth",
    version,
    about = "A thread-per-core message-queue broker with leases"
)]
struct Cli {
    /// Server to talk to [default http://127.0.0.1:7070; for bench: an embedded server].
    #[arg(long, global = true, env = "BERTH_SERVER")]
    server: Option<String>,
    /// Bearer token for a server started with --auth-token-file.
    #[arg(long, global = true, env = "BERTH_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the broker.
    Serve(ServeArgs),
    /// Create, list, describe or delete topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Produce the argument as one message; without it, every line of stdin as a message (or, with --frames,
    /// every frame: a 4-byte little-endian length, then the bytes), sent in batches. Prints one JSON line per
    /// message.
    Produce {
        topic: String,
        message: Option<String>,
        #[arg(long)]
        key: Option<String>,
        #[arg(long)]
        partition: Option<u64>,
        /// Read stdin as frames (binary-safe) instead of lines.
        #[arg(long)]
        frames: bool,
        /// Messages per request when reading stdin.
        #[arg(long, default_value_t = 100)]
        batch: usize,
    },
    /// Lease messages (queue style), or replay one with --partition and --offset.
    Consume {
        topic: String,
        /// Long-poll budget, e.g. 10s.
        #[arg(long, default_value = "0")]
        wait: String,
        /// Lease length, e.g. 30s (default: the topic's).
        #[arg(long)]
        visibility: Option<String>,
        /// Messages to take before stopping (stops early when none is available).
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Messages per request (a batch consume; acks and nacks are sent as one batch too).
        #[arg(long, default_value_t = 1)]
        max: u64,
        /// Ack each message once printed.
        #[arg(long, conflicts_with = "nack")]
        ack: bool,
        /// Nack each message once printed (it becomes deliverable again at once).
        #[arg(long)]
        nack: bool,
        /// Replay: read this partition at --offset without leasing.
        #[arg(long, requires = "offset")]
        partition: Option<u64>,
        #[arg(long, requires = "partition")]
        offset: Option<u64>,
    },
    /// Ack a lease.
    Ack {
        topic: String,
        receipt_handle: String,
    },
    /// Nack a lease: the message is deliverable again at once.
    Nack {
        topic: String,
        receipt_handle: String,
    },
    /// The load generator: per-core HDR histograms per operation.
    Bench(crate::cli::bench::BenchArgs),
    /// Extend a lease to now + visibility.
    Extend {
        topic: String,
        receipt_handle: String,
        #[arg(long)]
        visibility: Option<String>,
    },
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address to listen on [default 127.0.0.1:7070].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Data directory [default ./berth-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Number of cores (executors) [default: all available].
    #[arg(long)]
    cores: Option<usize>,
    /// CPUs to pin to, comma separated, e.g. 0,1.
    #[arg(long, value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
    /// always | interval:MS | never [default always].
    #[arg(long)]
    fsync: Option<FsyncPolicy>,
    /// A TOML file with any of the settings in the README.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Require `Authorization: Bearer TOKEN` with the token in this file (`/health` stays open).
    #[arg(long)]
    auth_token_file: Option<PathBuf>,
    /// Allow a non-loopback --listen address without --auth-token-file.
    #[arg(long)]
    insecure: bool,
}

#[derive(Subcommand, Debug)]
enum TopicCommand {
    /// Create a topic (200 when it already exists with the same partition count).
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        #[arg(long)]
        visibility: Option<String>,
        #[arg(long)]
        max_in_flight: Option<u64>,
        #[arg(long)]
        max_acked_ahead: Option<u64>,
        #[arg(long)]
        retention: Option<String>,
    },
    /// List topic names.
    List,
    /// Show a topic's settings and partitions.
    Describe { name: String },
    /// Delete a topic and its data.
    Delete { name: String },
}

/// Runs the command line; returns the exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Bench(args) => crate::cli::bench::run(&args, cli.server.as_deref()).map(|_| 0),
        other => {
            let client = Client::new(cli.server.as_deref().unwrap_or(DEFAULT_SERVER))
                .with_token(cli.auth_token);
            client_command(&client, other)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("berth: {e}");
            1
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn serve(args: ServeArgs) -> Result<i32, String> {
    init_logging();
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(v) = args.listen {
        config.listen = v;
    }
    if let Some(v) = args.data_dir {
        config.data_dir = v;
    }
    if let Some(v) = args.cores {
        config.cores = Some(v);
    }
    if let Some(v) = args.cpus {
        config.cpus = Some(v);
    }
    if let Some(v) = args.fsync {
        config.fsync = v;
    }
    if let Some(v) = args.auth_token_file {
        config.auth_token_file = Some(v);
    }
    if args.insecure {
        config.insecure = true;
    }
    berth::server::run(config)?;
    Ok(0)
}

/// Prints a JSON answer, or the error and a failing status.
fn finish(answer: Answer, ok: &[u16]) -> Result<i32, String> {
    if ok.contains(&answer.status) {
        if !answer.body.is_empty() {
            println!("{}", answer.text());
        }
        Ok(0)
    } else {
        let json = answer.json();
        let message = json["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| answer.text());
        let code = json["error"].as_str().unwrap_or("error");
        Err(format!("{} {code}: {message}", answer.status))
    }
}

fn client_command(client: &Client, command: Command) -> Result<i32, String> {
    match command {
        Command::Serve(_) | Command::Bench(_) => unreachable!("handled by main"),
        Command::Topic(t) => topic_command(client, t),
        Command::Produce {
            topic,
            message,
            key,
            partition,
            frames,
            batch,
        } => {
            let mut path = format!("/produce?topic={}", enc(&topic));
            if let Some(k) = key {
                path += &format!("&key={}", enc(&k));
            }
            if let Some(p) = partition {
                path += &format!("&partition={p}");
            }
            if let Some(m) = message {
                return finish(client.call("POST", &path, m.as_bytes())?, &[200]);
            }
            let mut input = Vec::new();
            std::io::stdin()
                .read_to_end(&mut input)
                .map_err(|e| format!("reading stdin: {e}"))?;
            let messages = if frames {
                split_frames(&input)?
            } else {
                split_lines(&input)
            };
            produce_batches(client, &path, &messages, batch.max(1))
        }
        Command::Consume {
            topic,
            wait,
            visibility,
            count,
            max,
            ack,
            nack,
            partition,
            offset,
        } => {
            if let (Some(p), Some(o)) = (partition, offset) {
                let path = format!(
                    "/consume?topic={}&partition={p}&offset={o}&wait={}",
                    enc(&topic),
                    enc(&wait)
                );
                let answer = client.call("GET", &path, &[])?;
                return print_messages(client, &topic, answer, None).map(|_| 0);
            }
            let mut path = format!("/consume?topic={}&wait={}", enc(&topic), enc(&wait));
            if let Some(v) = visibility {
                path += &format!("&visibility={}", enc(&v));
            }
            let settle = if ack {
                Some("ack")
            } else if nack {
                Some("nack")
            } else {
                None
            };
            if max > 1 {
                return consume_batches(client, &topic, &path, count, max, settle);
            }
            for _ in 0..count {
                let answer = client.call("GET", &path, &[])?;
                if !print_messages(client, &topic, answer, settle)? {
                    eprintln!("no message available");
                    break;
                }
            }
            Ok(0)
        }
        Command::Ack {
            topic,
            receipt_handle,
        } => settle(client, "ack", &topic, &receipt_handle, None),
        Command::Nack {
            topic,
            receipt_handle,
        } => settle(client, "nack", &topic, &receipt_handle, None),
        Command::Extend {
            topic,
            receipt_handle,
            visibility,
        } => settle(
            client,
            "extend",
            &topic,
            &receipt_handle,
            visibility.as_deref(),
        ),
    }
}

/// Lines of `input` (without their `\n` or `\r\n`); a last line without a newline counts, an empty input has none.
fn split_lines(input: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
        .into_iter()
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .collect()
}

/// Frames of `input`: a 4-byte little-endian length, then that many bytes.
fn split_frames(input: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < input.len() {
        let len = input
            .get(pos..pos + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or("stdin ends inside a frame length")?;
        let body = input
            .get(pos + 4..pos + 4 + len)
            .ok_or("stdin ends inside a frame")?;
        out.push(body);
        pos += 4 + len;
    }
    Ok(out)
}

/// Sends messages in batches (binary-safe frames) and prints one JSON result line per message, in order.
fn produce_batches(
    client: &Client,
    path: &str,
    messages: &[&[u8]],
    batch: usize,
) -> Result<i32, String> {
    let mut failed = 0;
    let mut out = std::io::stdout().lock();
    for chunk in messages.chunks(batch) {
        let mut body = Vec::new();
        for m in chunk {
            body.extend_from_slice(&(m.len() as u32).to_le_bytes());
            body.extend_from_slice(m);
        }
        let answer = client.call_with(
            "POST",
            path,
            &[("content-type", berth::ops::params::FRAMES)],
            &body,
        )?;
        if answer.status != 200 {
            return finish(answer, &[]);
        }
        let json = answer.json();
        for r in json["results"].as_array().into_iter().flatten() {
            if r.get("error").is_some() {
                failed += 1;
            }
            let _ = writeln!(out, "{r}");
        }
    }
    if failed > 0 {
        return Err(format!(
            "{failed} of {} messages were not written",
            messages.len()
        ));
    }
    Ok(0)
}

/// Batch consumes of up to `max` until `count` messages were printed (or none is available), settling each
/// batch with one request when asked.
fn consume_batches(
    client: &Client,
    topic: &str,
    path: &str,
    count: u64,
    max: u64,
    settle_with: Option<&str>,
) -> Result<i32, String> {
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    while printed < count {
        let want = max.min(count - printed);
        let answer = client.call_with(
            "GET",
            &format!("{path}&max={want}"),
            &[("accept", berth::ops::params::NDJSON)],
            &[],
        )?;
        match answer.status {
            204 => {
                eprintln!("no message available");
                break;
            }
            200 => {}
            _ => return finish(answer, &[]),
        }
        let text = answer.text();
        let mut handles = Vec::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            let _ = writeln!(out, "{line}");
            printed += 1;
            if let Some(h) = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["receipt_handle"].as_str().map(str::to_string))
            {
                handles.push(h);
            }
        }
        if let (Some(op), false) = (settle_with, handles.is_empty()) {
            let body = handles.join("\n");
            let answer = client.call_with(
                "POST",
                &format!("/{op}?topic={}", enc(topic)),
                &[("content-type", "text/plain")],
                body.as_bytes(),
            )?;
            if answer.status != 200 {
                return finish(answer, &[]);
            }
            let failed: Vec<String> = answer.json()["results"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["status"] != 200)
                .map(|r| r.to_string())
                .collect();
            if !failed.is_empty() {
                return Err(format!("{op} failed for: {}", failed.join(", ")));
            }
        }
    }
    Ok(0)
}

/// Prints one delivered message as a JSON line; returns false on 204.
fn print_messages(
    client: &Client,
    topic: &str,
    answer: Answer,
    settle_with: Option<&str>,
) -> Result<bool, String> {
    match answer.status {
        204 => Ok(false),
        200 => {
            let handle = answer.header("receipt-handle").map(str::to_string);
            let line = serde_json::json!({
                "partition": answer.header("partition").and_then(|v| v.parse::<u64>().ok()),
                "offset": answer.header("offset").and_then(|v| v.parse::<u64>().ok()),
                "receipt_handle": handle,
                "delivery_count": answer.header("delivery-count").and_then(|v| v.parse::<u64>().ok()),
                "body": answer.text(),
            });
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            if let (Some(op), Some(handle)) = (settle_with, handle) {
                settle(client, op, topic, &handle, None)?;
            }
            Ok(true)
        }
        _ => finish(answer, &[]).map(|_| false),
    }
}

fn settle(
    client: &Client,
    op: &str,
    topic: &str,
    handle: &str,
    visibility: Option<&str>,
) -> Result<i32, String> {
    let mut path = format!("/{op}?topic={}&receipt_handle={}", enc(topic), enc(handle));
    if let Some(v) = visibility {
        path += &format!("&visibility={}", enc(v));
    }
    finish(client.call("POST", &path, &[])?, &[200])
}

fn topic_command(client: &Client, command: TopicCommand) -> Result<i32, String> {
    match command {
        TopicCommand::Create {
            name,
            partitions,
            visibility,
            max_in_flight,
            max_acked_ahead,
            retention,
        } => {
            let mut path = format!("/topics/{}?partitions={partitions}", enc(&name));
            for (key, value) in [
                ("visibility", visibility),
                ("max_in_flight", max_in_flight.map(|v| v.to_string())),
                ("max_acked_ahead", max_acked_ahead.map(|v| v.to_string())),
                ("retention", retention),
            ] {
                if let Some(v) = value {
                    path += &format!("&{key}={}", enc(&v));
                }
            }
            finish(client.call("PUT", &path, &[])?, &[200, 201])
        }
        TopicCommand::List => finish(client.call("GET", "/topics", &[])?, &[200]),
        TopicCommand::Describe { name } => finish(
            client.call("GET", &format!("/topics/{}", enc(&name)), &[])?,
            &[200],
        ),
        TopicCommand::Delete { name } => {
            let answer = client.call("DELETE", &format!("/topics/{}", enc(&name)), &[])?;
            let code = finish(answer, &[204])?;
            eprintln!("deleted {name}");
            Ok(code)
        }
    }
}
