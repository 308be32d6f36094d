//! Joining many futures on one core, for every layer (a leaf: imports nothing of berth).

/// Awaits every future, concurrently on this core, returning their outputs in order.
pub async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    if futures.len() == 1 {
        let mut futures = futures;
        let only = futures.pop().expect("one future");
        return vec![only.await];
    }
    let mut pending: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    futures_lite::future::poll_fn(|cx| {
        let mut done = true;
        for (i, f) in pending.iter_mut().enumerate() {
            if outputs[i].is_some() {
                continue;
            }
            match f.as_mut().poll(cx) {
                std::task::Poll::Ready(out) => outputs[i] = Some(out),
                std::task::Poll::Pending => done = false,
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}
