//! Micro-benchmarks of the hot pieces: the lease shard, the frame codec, request parsing, and the cross-core round
//! trip. Run with `cargo bench --bench hot_paths`; each group compares variants measured in the same run.

use berth::http::request::{parse, Limits};
use berth::partition::inflight::{InFlight, Limits as Caps, Reserve};
use berth::storage::frame;
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use std::time::{Duration, Instant};

const CAPS: Caps = Caps {
    max_in_flight: 1024,
    max_acked_ahead: 1024,
};

fn inflight(c: &mut Criterion) {
    let mut g = c.benchmark_group("inflight");
    g.bench_function("reserve+ack in order", |b| {
        let mut s = InFlight::new(0, 1, CAPS);
        let mut end = 0u64;
        b.iter(|| {
            end += 1;
            let Reserve::Leased(l) = s.reserve(end, 1, 30_000) else {
                panic!("nothing to lease")
            };
            black_box(s.ack(l.offset, l.nonce, 1).unwrap());
        })
    });
    g.bench_function("reserve 64 then ack out of order", |b| {
        b.iter_batched(
            || InFlight::new(0, 1, CAPS),
            |mut s| {
                let leases: Vec<_> = (0..64)
                    .map(|_| match s.reserve(64, 1, 30_000) {
                        Reserve::Leased(l) => l,
                        _ => panic!("nothing to lease"),
                    })
                    .collect();
                for l in leases.iter().rev() {
                    s.ack(l.offset, l.nonce, 1).unwrap();
                }
                black_box(s.committed())
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("extend", |b| {
        let mut s = InFlight::new(0, 1, CAPS);
        let Reserve::Leased(l) = s.reserve(1, 1, 30_000) else {
            panic!()
        };
        let mut now = 1;
        b.iter(|| {
            now += 1;
            black_box(s.extend(l.offset, l.nonce, now, Some(30_000)).unwrap());
        })
    });
    g.bench_function("purge 1024 expired", |b| {
        b.iter_batched(
            || {
                let mut s = InFlight::new(0, 1, CAPS);
                for _ in 0..1024 {
                    s.reserve(1024, 1, 1000);
                }
                s
            },
            |mut s| black_box(s.purge_expired(5000)),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame");
    let payload = vec![7u8; 100];
    let mut buf = Vec::with_capacity(256);
    g.bench_function("encode 100B", |b| {
        b.iter(|| {
            buf.clear();
            frame::encode(42, 1_700_000_000_000, black_box(&payload), &mut buf);
        })
    });
    buf.clear();
    frame::encode(42, 1_700_000_000_000, &payload, &mut buf);
    g.bench_function("decode+verify 100B", |b| {
        b.iter(|| black_box(frame::decode_frame(black_box(&buf), 42, 1 << 20).is_ok()))
    });
    let mut segment = Vec::new();
    for i in 0..10_000u64 {
        frame::encode(i, 1, &payload, &mut segment);
    }
    g.bench_function("scan 10k frames", |b| {
        b.iter(|| black_box(frame::scan(black_box(&segment), 0, 1 << 20).next_offset))
    });
    g.finish();
}

fn requests(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    let limits = Limits {
        max_header_bytes: 16 << 10,
        max_headers: 64,
        max_body_bytes: 1 << 20,
        max_batch_bytes: 16 << 20,
    };
    let produce = format!(
        "POST /produce?topic=bench HTTP/1.1\r\nhost: 127.0.0.1:7070\r\ncontent-length: 100\r\n\r\n{}",
        "x".repeat(100)
    );
    g.bench_function("parse produce", |b| {
        b.iter(|| black_box(parse(black_box(produce.as_bytes()), &limits).is_ok()))
    });
    let ack = "POST /ack?topic=bench&receipt_handle=0:12345:459785088235955457 HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
    g.bench_function("parse ack", |b| {
        b.iter(|| black_box(parse(black_box(ack.as_bytes()), &limits).is_ok()))
    });
    g.finish();
}

/// Round trips between two pinned executors over glommio's channel mesh with a oneshot reply, as the broker
/// forwards work; measured against a same-core baseline (a local oneshot).
fn cross_core(c: &mut Criterion) {
    use futures_channel::oneshot;
    use glommio::channels::channel_mesh::MeshBuilder;
    use glommio::{LocalExecutorBuilder, Placement};
    let mut g = c.benchmark_group("cross_core");
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("same-core oneshot (baseline)", |b| {
        let ex = LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .unwrap();
        b.iter_custom(|iters| {
            ex.run(async move {
                let start = Instant::now();
                for i in 0..iters {
                    let (tx, rx) = oneshot::channel::<u64>();
                    glommio::spawn_local(async move {
                        let _ = tx.send(i);
                    })
                    .detach();
                    black_box(rx.await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    let cpus = core_affinity::get_core_ids().map(|v| v.len()).unwrap_or(1);
    if cpus >= 2 {
        g.bench_function("mesh round trip, 1 in flight", |b| {
            b.iter_custom(|iters| {
                let mesh = MeshBuilder::<(u64, oneshot::Sender<u64>), _>::full(2, 64);
                let m2 = mesh.clone();
                let server = LocalExecutorBuilder::new(Placement::Fixed(1))
                    .spawn(move || async move {
                        let (_tx, mut rx) = m2.join().await.unwrap();
                        use futures_lite::StreamExt;
                        let (_, mut stream) = rx.streams().pop().unwrap();
                        while let Some((v, reply)) = stream.next().await {
                            let _ = reply.send(v);
                        }
                    })
                    .unwrap();
                let client = LocalExecutorBuilder::new(Placement::Fixed(0))
                    .spawn(move || async move {
                        let (tx, _rx) = mesh.join().await.unwrap();
                        let peer = 1 - tx.peer_id();
                        let start = Instant::now();
                        for i in 0..iters {
                            let (rtx, rrx) = oneshot::channel();
                            tx.send_to(peer, (i, rtx)).await.unwrap();
                            black_box(rrx.await.unwrap());
                        }
                        let elapsed = start.elapsed();
                        tx.close();
                        elapsed
                    })
                    .unwrap();
                let elapsed = client.join().unwrap();
                server.join().unwrap();
                elapsed
            })
        });
    }
    g.finish();
}

criterion_group!(benches, inflight, frames, requests, cross_core);
criterion_main!(benches);
