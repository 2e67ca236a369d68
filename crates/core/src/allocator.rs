//! The process's memory allocator: jemalloc, with options that return freed memory to the
//! system within seconds (feature `jemalloc`, which the mcm-rs binaries enable).
//!
//! A controller's memory follows its fleet: a scale-up fills the stores, queues and connection
//! buffers, a scale-down empties them. With the C library's allocator (glibc's, or musl's in
//! the static images) the resident memory after each such burst stayed above the one before,
//! although the heap in use at rest did not grow: pages that still held a few live objects
//! were kept. jemalloc groups small objects of one size together and, with the options below,
//! gives pages that stay unused back to the system in the background.
//!
//! Enabling the feature makes jemalloc the global allocator of the binary that links this
//! crate. A binary that sets its own `#[global_allocator]` must leave the feature off.
//! `_RJEM_MALLOC_CONF` in the environment overrides the options, one by one (jemalloc's
//! `MALLOC_CONF` under the prefix this build uses), e.g. `_RJEM_MALLOC_CONF=dirty_decay_ms:10000`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// jemalloc as the process's allocator.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, in its `MALLOC_CONF` syntax, as this crate sets them.
///
/// - `background_thread:true`: a background thread (at most one per CPU) returns unused
///   pages, so an idle controller, which allocates nothing, still gives back what its last
///   burst left; without it, pages are returned only while the process allocates.
/// - `dirty_decay_ms:1000`: freed pages are returned over about a second (jemalloc's default
///   is 10 s), so resident memory follows the fleet down soon after a scale-down.
/// - `muzzy_decay_ms:0`: returned pages go back at once with `MADV_DONTNEED`, which lowers
///   the resident set as the kernel counts it, rather than through `MADV_FREE`, which lowers it
///   only when the machine is short of memory.
pub const OPTIONS: &str = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0";

/// [`OPTIONS`] as jemalloc reads them at its start: the C string `malloc_conf`, named with
/// the prefix tikv-jemalloc-sys gives jemalloc's symbols. jemalloc defines the symbol weakly;
/// this definition takes its place.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; OPTIONS.len() + 1] = &nul_terminated();

/// [`OPTIONS`] with a terminating NUL.
const fn nul_terminated() -> [u8; OPTIONS.len() + 1] {
    let mut out = [0u8; OPTIONS.len() + 1];
    let bytes = OPTIONS.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        out[i] = bytes[i];
        i += 1;
    }
    out
}

/// The allocator's view of the process's memory, read at each scrape of `/metrics`:
/// `mcm_allocator_allocated_bytes`, the bytes the process has allocated and not freed (its
/// heap in use), and `mcm_allocator_resident_bytes`, the bytes of the allocator's pages that
/// are resident (the heap with what the allocator keeps around it). Resident memory that
/// grows while the first stays flat is the allocator's, not the controller's.
#[derive(Debug, Default)]
pub struct AllocatorMetrics;

impl AllocatorMetrics {
    /// Registers the metrics in `registry`.
    pub fn register(registry: &mut Registry) {
        registry.register_collector(Box::new(AllocatorMetrics));
    }
}

/// jemalloc's statistics, refreshed (they are a snapshot taken at each `epoch` advance).
/// `None` when jemalloc does not answer, which a build of jemalloc without statistics does.
fn allocator_bytes() -> Option<(usize, usize)> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    let allocated = tikv_jemalloc_ctl::stats::allocated::read().ok()?;
    let resident = tikv_jemalloc_ctl::stats::resident::read().ok()?;
    Some((allocated, resident))
}

impl Collector for AllocatorMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((allocated, resident)) = allocator_bytes() else {
            return Ok(());
        };
        for (name, help, value) in [
            (
                "mcm_allocator_allocated_bytes",
                "Bytes the process has allocated and not freed (jemalloc's stats.allocated).",
                allocated,
            ),
            (
                "mcm_allocator_resident_bytes",
                "Bytes of the allocator's pages resident in memory (jemalloc's stats.resident).",
                resident,
            ),
        ] {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options in effect, read back from jemalloc (`opt.*` are the options it started
    /// with). Fails when jemalloc did not read [`MALLOC_CONF`], e.g. under another symbol name.
    #[test]
    fn jemalloc_starts_with_the_options_of_this_crate() {
        if std::env::var_os("_RJEM_MALLOC_CONF").is_some() {
            eprintln!("_RJEM_MALLOC_CONF is set: it overrides the options under test");
            return;
        }
        assert_eq!(MALLOC_CONF.last(), Some(&0));
        assert_eq!(&MALLOC_CONF[..OPTIONS.len()], OPTIONS.as_bytes());
        // Allocate through the global allocator first, so jemalloc has started.
        let v = std::hint::black_box(vec![1u8; 4096]);
        assert_eq!(v.len(), 4096);
        let background: bool = unsafe { tikv_jemalloc_ctl::raw::read(b"opt.background_thread\0") }
            .expect("opt.background_thread");
        let dirty: isize =
            unsafe { tikv_jemalloc_ctl::raw::read(b"opt.dirty_decay_ms\0") }.expect("dirty");
        let muzzy: isize =
            unsafe { tikv_jemalloc_ctl::raw::read(b"opt.muzzy_decay_ms\0") }.expect("muzzy");
        assert_eq!((background, dirty, muzzy), (true, 1000, 0));
    }

    /// The metrics report jemalloc's figures: a live allocation of 64 MiB is in the allocated
    /// bytes and, written to, in the resident bytes.
    #[test]
    fn the_metrics_report_the_heap_in_use_and_the_resident_pages() {
        let mut registry = Registry::default();
        AllocatorMetrics::register(&mut registry);
        let read = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
            let value = |name: &str| -> f64 {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name} ")))
                    .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
                    .parse()
                    .expect("a number")
            };
            (
                value("mcm_allocator_allocated_bytes"),
                value("mcm_allocator_resident_bytes"),
            )
        };
        let block = std::hint::black_box(vec![7u8; 64 << 20]);
        let (allocated, resident) = read(&registry);
        assert!(allocated >= (64 << 20) as f64, "allocated {allocated}");
        assert!(resident >= (64 << 20) as f64, "resident {resident}");
        assert!(
            resident >= allocated,
            "resident {resident} < allocated {allocated}"
        );
        drop(block);
        let (after, _) = read(&registry);
        assert!(
            after <= allocated - (64 << 20) as f64 + (8 << 20) as f64,
            "{after} after the free"
        );
    }
}
