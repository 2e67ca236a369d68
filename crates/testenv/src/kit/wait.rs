//! Bounded waits: [`within`] for a future, [`eventually`] for a polled check, the
//! watch-based [`await_object`] and [`await_list`], and [`consistently`] for a check that
//! must hold for a while (something that must not happen).

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::wait::{Condition, await_condition};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde::de::DeserializeOwned;

/// The pause between two polls of [`eventually`] and [`consistently`].
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Awaits `fut` for at most `timeout`; panics naming `what` when it takes longer.
pub async fn within<T>(timeout: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// What one poll of [`eventually`] or [`consistently`] returns: satisfied with a value, or
/// not (yet) with an observation to report.
pub trait Outcome {
    /// The value of a satisfied check.
    type Value;
    /// `Ok(value)` when the check is satisfied, else `Err(what was observed)`.
    fn judge(self) -> Result<Self::Value, String>;
}

impl Outcome for bool {
    type Value = ();
    fn judge(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("false".into()) }
    }
}

/// Always satisfied: for a check that says "not yet" with `Err` (`anyhow::ensure!`).
impl Outcome for () {
    type Value = ();
    fn judge(self) -> Result<(), String> {
        Ok(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn judge(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

/// A fallible check: `Ok(outcome)` is judged as `outcome`; `Err` (a transient API error, a
/// failed `anyhow::ensure!`, or any observation) means "not yet", and is reported if the
/// time runs out.
impl<O: Outcome, E: Debug> Outcome for Result<O, E> {
    type Value = O::Value;
    fn judge(self) -> Result<O::Value, String> {
        self.map_err(|e| format!("{e:?}"))?.judge()
    }
}

/// [`try_eventually`] ran out of time.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {waited:?} waiting for {what}; last observation: {last}")]
pub struct Timeout {
    /// What was awaited.
    pub what: String,
    /// How long.
    pub waited: Duration,
    /// What the last poll saw.
    pub last: String,
}

/// Polls `check` every [`POLL_INTERVAL`] until it is satisfied (see [`Outcome`]) or
/// `timeout` has passed (a check that hangs is cut off at the deadline too); the error names
/// `what` and the last observation.
pub async fn try_eventually<R, F, Fut>(
    timeout: Duration,
    what: &str,
    mut check: F,
) -> Result<R::Value, Timeout>
where
    R: Outcome,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen: Option<String> = None;
    loop {
        let last = match tokio::time::timeout_at(deadline, check()).await {
            Ok(outcome) => match outcome.judge() {
                Ok(v) => return Ok(v),
                Err(observed) => observed,
            },
            // The check hung until the deadline: what the one before saw is still news.
            Err(_) => match &seen {
                Some(before) => {
                    format!("the check itself did not finish in time; the one before saw: {before}")
                }
                None => "the check itself did not finish in time".into(),
            },
        };
        seen = Some(last.clone());
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(Timeout {
                what: what.into(),
                waited: timeout,
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
    }
}

/// [`try_eventually`], panicking with its error.
pub async fn eventually<R, F, Fut>(timeout: Duration, what: &str, check: F) -> R::Value
where
    R: Outcome,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    match try_eventually(timeout, what, check).await {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// [`try_consistently`] saw its check unsatisfied before the duration was over.
#[derive(Debug, thiserror::Error)]
#[error("{what} stopped holding after {after:?} of {duration:?}; observed: {observed}")]
pub struct Violation {
    /// What was to hold.
    pub what: String,
    /// When the failing poll ended, counted from the start of the wait.
    pub after: Duration,
    /// How long it was to hold.
    pub duration: Duration,
    /// What the failing poll saw.
    pub observed: String,
}

/// Polls `check` every [`POLL_INTERVAL`] for `duration` (a first poll at once, a last one at
/// the end) and stops at the first poll that is not satisfied (see [`Outcome`]): the error
/// names `what`, when, and the observation. A check that does not finish within `duration`
/// of its start is cut off and counts as unsatisfied (the wait takes at most about twice
/// `duration`). Returns the value of the last poll when every poll was satisfied.
///
/// It proves nothing about what the system has not looked at yet: wait (with
/// [`eventually`] or a watch) until the system has seen the change whose consequence must
/// not happen, then hold the check.
pub async fn try_consistently<R, F, Fut>(
    duration: Duration,
    what: &str,
    mut check: F,
) -> Result<R::Value, Violation>
where
    R: Outcome,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    let began = tokio::time::Instant::now();
    let deadline = began + duration;
    loop {
        let judged = match tokio::time::timeout(duration, check()).await {
            Ok(outcome) => outcome.judge(),
            Err(_) => Err(format!(
                "the check itself did not finish within {duration:?}"
            )),
        };
        let now = tokio::time::Instant::now();
        match judged {
            Ok(v) if now >= deadline => return Ok(v),
            Ok(_) => {}
            Err(observed) => {
                return Err(Violation {
                    what: what.into(),
                    after: now - began,
                    duration,
                    observed,
                });
            }
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
    }
}

/// [`try_consistently`], panicking with its error.
pub async fn consistently<R, F, Fut>(duration: Duration, what: &str, check: F) -> R::Value
where
    R: Outcome,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    match try_consistently(duration, what, check).await {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// Waits on a watch until the object `name` of `api` satisfies `cond` (a closure over
/// `Option<&K>`, `None` meaning absent, or one of `kube::runtime::wait::conditions`); returns
/// it as it is then. Panics naming `what` after `timeout`, or when the watch
/// fails.
pub async fn await_object<K>(
    api: Api<K>,
    name: &str,
    timeout: Duration,
    what: &str,
    cond: impl Condition<K>,
) -> Option<K>
where
    K: kube::Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    within(timeout, what, await_condition(api, name, cond))
        .await
        .unwrap_or_else(|e| panic!("the watch for {what} failed: {e}"))
}

/// Waits on a watch until the object `name` of `api` is gone; panics naming it (kind and
/// name) after `timeout`.
pub async fn await_gone<K>(api: Api<K>, name: &str, timeout: Duration)
where
    K: kube::Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let what = format!("{} {name} to be deleted", K::kind(&()));
    await_object(api, name, timeout, &what, |o: Option<&K>| o.is_none()).await;
}

/// Waits on a watch (a reflector over all objects of `api`) until the objects satisfy
/// `pred`, and returns them; panics naming `what` and listing the objects as they are then
/// when `timeout` passes first.
pub async fn await_list<K>(
    api: Api<K>,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&[K]) -> bool,
) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + serde::Serialize
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let mut stream = reflector::reflector(writer, watcher(api.clone(), watcher::Config::default()))
        .default_backoff()
        .boxed();
    let result = tokio::time::timeout(timeout, async {
        let mut synced = false;
        loop {
            match stream.next().await {
                None => break None,
                Some(Ok(watcher::Event::InitDone)) => synced = true,
                Some(_) => {}
            }
            if !synced {
                continue;
            }
            let items: Vec<K> = reader.state().iter().map(|x| (**x).clone()).collect();
            if pred(&items) {
                break Some(items);
            }
        }
    })
    .await;
    match result {
        Ok(Some(items)) => items,
        _ => {
            let now = match api.list(&ListParams::default()).await {
                Ok(list) => describe(&list.items),
                Err(e) => format!("(the list failed: {e})"),
            };
            panic!("timed out after {timeout:?} waiting for {what}; now:\n{now}");
        }
    }
}

/// The objects one per line as JSON without `metadata.managedFields` (which would crowd out
/// what a failed wait needs to show: names, annotations, finalizers, spec and status).
pub fn describe<K: serde::Serialize>(items: &[K]) -> String {
    if items.is_empty() {
        return "(none)".into();
    }
    items
        .iter()
        .map(|item| {
            let mut v = serde_json::to_value(item).unwrap_or_default();
            if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                meta.remove("managedFields");
            }
            format!("- {v}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn eventually_returns_the_value_of_the_first_satisfied_poll() {
        let mut n = 0;
        let v = eventually(Duration::from_secs(5), "n to reach 3", || {
            n += 1;
            let seen = n;
            async move { (seen >= 3).then_some(seen) }
        })
        .await;
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn a_timeout_names_what_was_awaited_and_the_last_observation() {
        let err = try_eventually(Duration::from_millis(300), "the answer", || async {
            Err::<(), _>("still 41")
        })
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("the answer"), "{text}");
        assert!(text.contains("still 41"), "{text}");
    }

    #[tokio::test]
    async fn a_hanging_check_is_cut_off_at_the_deadline() {
        let began = std::time::Instant::now();
        let err = try_eventually(Duration::from_millis(200), "a hang", || {
            std::future::pending::<bool>()
        })
        .await
        .unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(2));
        assert!(err.last.contains("did not finish"), "{err}");
    }

    #[tokio::test]
    async fn a_check_that_hangs_at_the_end_still_reports_what_the_one_before_saw() {
        let mut n = 0;
        let err = try_eventually(Duration::from_millis(500), "a late hang", || {
            n += 1;
            let first = n == 1;
            async move {
                if first {
                    Err("holders [old-pod]")
                } else {
                    std::future::pending::<Result<(), &str>>().await
                }
            }
        })
        .await
        .unwrap_err();
        assert!(err.last.contains("did not finish"), "{err}");
        assert!(err.last.contains("holders [old-pod]"), "{err}");
    }

    #[tokio::test]
    async fn consistently_polls_for_the_whole_duration_and_returns_the_last_value() {
        let began = std::time::Instant::now();
        let mut n = 0;
        let last = consistently(Duration::from_millis(700), "n to stay small", || {
            n += 1;
            let seen = n;
            async move { (seen < 100).then_some(seen) }
        })
        .await;
        assert!(began.elapsed() >= Duration::from_millis(700));
        // At once, every 200 ms, and at the end (0, 200, 400, 600, 700 ms unless loaded).
        assert!(last >= 2, "polled {last} times");
        assert_eq!(last, n);
    }

    #[tokio::test]
    async fn consistently_stops_at_the_first_violation_and_reports_it() {
        let began = std::time::Instant::now();
        let mut n = 0;
        let err = try_consistently(Duration::from_secs(30), "the answer to stay 42", || {
            n += 1;
            let seen = n;
            async move {
                if seen < 3 {
                    Ok(())
                } else {
                    Err(format!("it became {}", 40 + seen))
                }
            }
        })
        .await
        .unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(5), "{err}");
        assert_eq!(n, 3, "no poll after the violation");
        let text = err.to_string();
        assert!(text.contains("the answer to stay 42"), "{text}");
        assert!(text.contains("it became 43"), "{text}");
        assert!(err.after < Duration::from_secs(5), "{err:?}");
    }

    #[tokio::test]
    async fn a_hanging_check_fails_consistently_and_is_cut_off() {
        let began = std::time::Instant::now();
        let err = try_consistently(Duration::from_millis(300), "a hang", || {
            std::future::pending::<bool>()
        })
        .await
        .unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(2));
        assert!(err.observed.contains("did not finish"), "{err}");
    }

    #[tokio::test]
    #[should_panic(expected = "false to hold stopped holding after")]
    async fn consistently_panics_naming_what() {
        consistently(Duration::from_secs(10), "false to hold", || async { false }).await;
    }

    #[tokio::test]
    #[should_panic(expected = "timed out after 10ms waiting for nothing")]
    async fn within_panics_naming_what() {
        within(
            Duration::from_millis(10),
            "nothing",
            std::future::pending::<()>(),
        )
        .await;
    }
}
