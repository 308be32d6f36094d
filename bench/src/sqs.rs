//! The SQS face as a load-generator protocol, so its cost is measured against the native API by the same client in
//! the same run (`benches/sqs_cost.sh`): produce = SendMessage(Batch), consume = ReceiveMessage, ack =
//! DeleteMessage(Batch), each a JSON 1.0 request (`X-Amz-Target`), as a current AWS SDK sends them (unsigned: the
//! server runs without `sqs_credentials`).

use super::http::{Conn, Reply, Req};
use super::{Consumed, Driver, Pipelined};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

const SEND: &str =
    "content-type: application/x-amz-json-1.0\r\nx-amz-target: AmazonSQS.SendMessage\r\n";
const SEND_BATCH: &str =
    "content-type: application/x-amz-json-1.0\r\nx-amz-target: AmazonSQS.SendMessageBatch\r\n";
const RECEIVE: &str =
    "content-type: application/x-amz-json-1.0\r\nx-amz-target: AmazonSQS.ReceiveMessage\r\n";
const DELETE: &str =
    "content-type: application/x-amz-json-1.0\r\nx-amz-target: AmazonSQS.DeleteMessage\r\n";
const DELETE_BATCH: &str =
    "content-type: application/x-amz-json-1.0\r\nx-amz-target: AmazonSQS.DeleteMessageBatch\r\n";

/// SQS's largest batch.
pub const MAX_SQS_BATCH: usize = 10;

/// One connection speaking SQS's JSON protocol to berth.
pub struct Sqs {
    conn: Conn,
    queue_url: String,
    batch: usize,
    /// The message length (the body sent is that many `m`s: an SQS body is text).
    message_len: usize,
    send_body: Vec<u8>,
    receive_body: Vec<u8>,
}

#[derive(serde::Deserialize)]
struct Received {
    #[serde(rename = "Messages", default)]
    messages: Vec<Message>,
}

#[derive(serde::Deserialize)]
struct Message {
    #[serde(rename = "ReceiptHandle")]
    receipt_handle: String,
    #[serde(rename = "Body")]
    body: String,
}

#[derive(serde::Deserialize)]
struct BatchResult {
    #[serde(rename = "Successful", default)]
    successful: Vec<serde_json::Value>,
}

impl Sqs {
    pub async fn connect(
        addr: SocketAddr,
        topic: &str,
        visibility_s: u64,
        wait_s: u64,
        batch: usize,
        message: Arc<Vec<u8>>,
    ) -> io::Result<Sqs> {
        let queue_url = format!("http://{addr}/000000000000/{topic}");
        let text = "m".repeat(message.len());
        let send_body = if batch == 1 {
            serde_json::json!({"QueueUrl": queue_url, "MessageBody": text})
        } else {
            let entries: Vec<_> = (0..batch)
                .map(|i| serde_json::json!({"Id": i.to_string(), "MessageBody": text}))
                .collect();
            serde_json::json!({"QueueUrl": queue_url, "Entries": entries})
        };
        let receive_body = serde_json::json!({
            "QueueUrl": queue_url,
            "MaxNumberOfMessages": batch,
            "WaitTimeSeconds": wait_s,
            "VisibilityTimeout": visibility_s,
        });
        Ok(Sqs {
            conn: Conn::connect(addr, None).await?,
            queue_url,
            batch,
            message_len: message.len(),
            send_body: serde_json::to_vec(&send_body).expect("JSON"),
            receive_body: serde_json::to_vec(&receive_body).expect("JSON"),
        })
    }

    fn delete_body(&self, handles: &[String]) -> Vec<u8> {
        let value = if handles.len() == 1 {
            serde_json::json!({"QueueUrl": self.queue_url, "ReceiptHandle": handles[0]})
        } else {
            let entries: Vec<_> = handles
                .iter()
                .enumerate()
                .map(|(i, h)| serde_json::json!({"Id": i.to_string(), "ReceiptHandle": h}))
                .collect();
            serde_json::json!({"QueueUrl": self.queue_url, "Entries": entries})
        };
        serde_json::to_vec(&value).expect("JSON")
    }

    fn delete_headers(handles: &[String]) -> &'static str {
        if handles.len() == 1 {
            DELETE
        } else {
            DELETE_BATCH
        }
    }

    fn sent(&self, reply: &Reply, n: usize) -> usize {
        if reply.status != 200 {
            return 0;
        }
        if self.batch == 1 {
            return 1;
        }
        serde_json::from_slice::<BatchResult>(&reply.body).map_or(0, |r| r.successful.len().min(n))
    }

    fn received(&self, reply: Reply) -> Consumed<String> {
        let mut c = Consumed {
            handles: Vec::new(),
            intact: 0,
            ok: reply.status == 200,
            empty: false,
        };
        if reply.status != 200 {
            return c;
        }
        match serde_json::from_slice::<Received>(&reply.body) {
            Ok(r) => {
                c.empty = r.messages.is_empty();
                for m in r.messages {
                    c.intact += usize::from(m.body.len() == self.message_len);
                    c.handles.push(m.receipt_handle);
                }
            }
            Err(_) => c.ok = false,
        }
        c
    }

    fn deleted(reply: &Reply, n: usize) -> usize {
        if reply.status != 200 {
            return 0;
        }
        if n == 1 {
            return 1;
        }
        serde_json::from_slice::<BatchResult>(&reply.body).map_or(0, |r| r.successful.len().min(n))
    }
}

impl Driver for Sqs {
    type Handle = String;

    async fn produce(&mut self, n: usize) -> io::Result<usize> {
        let (headers, body);
        if self.batch == 1 || n == self.batch {
            headers = if self.batch == 1 { SEND } else { SEND_BATCH };
            body = self.send_body.clone();
        } else {
            let text = "m".repeat(self.message_len);
            let entries: Vec<_> = (0..n)
                .map(|i| serde_json::json!({"Id": i.to_string(), "MessageBody": text}))
                .collect();
            headers = SEND_BATCH;
            body = serde_json::to_vec(
                &serde_json::json!({"QueueUrl": self.queue_url, "Entries": entries}),
            )
            .expect("JSON");
        }
        let reply = self
            .conn
            .request(Req {
                headers,
                keep_body: true,
                ..Req::new("POST", "/", &body)
            })
            .await?;
        Ok(self.sent(&reply, n))
    }

    async fn consume(&mut self) -> io::Result<Consumed<String>> {
        let reply = self
            .conn
            .request(Req {
                headers: RECEIVE,
                keep_body: true,
                ..Req::new("POST", "/", &self.receive_body)
            })
            .await?;
        Ok(self.received(reply))
    }

    async fn ack(&mut self, handles: &[String]) -> io::Result<usize> {
        let body = self.delete_body(handles);
        let reply = self
            .conn
            .request(Req {
                headers: Self::delete_headers(handles),
                keep_body: true,
                ..Req::new("POST", "/", &body)
            })
            .await?;
        Ok(Self::deleted(&reply, handles.len()))
    }

    async fn pipelined_cycle(&mut self, previous: &[String]) -> io::Result<Pipelined<String>> {
        let delete_body = (!previous.is_empty()).then(|| self.delete_body(previous));
        let mut requests: Vec<Req<'_>> = Vec::with_capacity(3);
        if let Some(body) = &delete_body {
            requests.push(Req {
                headers: Self::delete_headers(previous),
                keep_body: true,
                ..Req::new("POST", "/", body)
            });
        }
        requests.push(Req {
            headers: if self.batch == 1 { SEND } else { SEND_BATCH },
            keep_body: true,
            ..Req::new("POST", "/", &self.send_body)
        });
        requests.push(Req {
            headers: RECEIVE,
            keep_body: true,
            ..Req::new("POST", "/", &self.receive_body)
        });
        let with_delete = requests.len() == 3;
        let mut replies = self.conn.pipeline(&requests).await?.into_iter();
        let mut next = || {
            replies
                .next()
                .ok_or_else(|| io::Error::other("a pipelined reply is missing"))
        };
        let acked = if with_delete {
            let (reply, at) = next()?;
            Some((Self::deleted(&reply, previous.len()), at))
        } else {
            None
        };
        let (reply, produced_at) = next()?;
        let produced = self.sent(&reply, self.batch);
        let (reply, consumed_at) = next()?;
        Ok(Pipelined {
            acked,
            produced: (produced, produced_at),
            consumed: (self.received(reply), consumed_at),
        })
    }
}
