//! Bounded concurrency for fan-out work such as per-capability classification
//! (`max_concurrent_classifications`). Pure future combinators; no runtime, no I/O.

use std::future::Future;

use futures::StreamExt;

/// Runs `work` on every item with at most `limit` futures in flight, returning the results in
/// input order. A `limit` of zero is treated as one.
pub async fn run_bounded<I, F, Fut, T>(items: I, limit: usize, work: F) -> Vec<T>
where
    I: IntoIterator,
    F: FnMut(I::Item) -> Fut,
    Fut: Future<Output = T>,
{
    futures::stream::iter(items).map(work).buffered(limit.max(1)).collect().await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn never_exceeds_the_limit_and_keeps_order() {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let results = run_bounded(0..20, 5, |item| {
            let in_flight = in_flight.clone();
            let peak = peak.clone();
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                in_flight.fetch_sub(1, Ordering::SeqCst);
                item * 2
            }
        })
        .await;
        assert_eq!(results, (0..20).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(peak.load(Ordering::SeqCst), 5, "the limit is reached and never exceeded");
    }
}
