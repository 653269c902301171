//! Log context across threads: the engine's threads log under the span of
//! the transfer and session that started them, so an in-cluster agent's
//! lines name the Transfer they belong to.

/// `f`, to run on another thread under the span current here.
pub fn carry<T>(f: impl FnOnce() -> T) -> impl FnOnce() -> T {
    let span = tracing::Span::current();
    move || span.in_scope(f)
}
