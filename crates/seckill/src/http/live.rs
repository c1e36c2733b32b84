//! The pages' event streams: the instance's live figures as server-sent
//! events, one stream per page, all fed by the one read per tick of
//! [`crate::live`].
//!
//! An event is sent when the figures change (at most once per tick) and a
//! comment every 15 s keeps idle proxies from closing the stream. Each
//! stream holds one connection for as long as the page is open, counted
//! against the server's connection caps like any other; the streams end
//! when the service stops, so a graceful shutdown is not held up by them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::{Stream, StreamExt};
use tokio_stream::wrappers::WatchStream;

use crate::http::extract::Admin;
use crate::http::AppState;
use crate::live::Snapshot;

/// `GET /api/live`: open and coming sales with their stock, and the
/// server's clock.
pub(crate) async fn storefront(
    State(state): State<AppState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    events(&state, |s| s.events.storefront.clone())
}

/// `GET /api/admin/live`: the same, with the instance's counters and the
/// health of its stores.
pub(crate) async fn console(
    State(state): State<AppState>,
    _: Admin,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    events(&state, |s| s.events.console.clone())
}

fn events(
    state: &AppState,
    payload: fn(&Snapshot) -> Arc<str>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let live = state.live.clone();
    let stopped = async move { live.stopped().await };
    let stream = WatchStream::new(state.live.watch())
        .map(move |snapshot| Ok(Event::default().event("figures").data(&*payload(&snapshot))))
        .take_until(Box::pin(stopped));
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
