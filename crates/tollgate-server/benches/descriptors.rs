//! The cost of one request as its descriptors grow: the service's work is
//! linear in their number (`cargo bench -p tollgate-server --bench
//! descriptors`; the throughput line is descriptors per second, flat when
//! linear). Memory store, a raised cap, every descriptor its own subject.

// The service's futures nest deeply (as in the server crate itself).
#![recursion_limit = "256"]

use std::path::Path;

use criterion::{BenchmarkId, Criterion, Throughput};
use tollgate::{AnyStore, MemoryStore};
use tollgate_server::config::Domain;
use tollgate_server::service::{CheckRequest, Descriptor, Options, Service};
use tollgate_server::Config;

fn service() -> Service {
    let domain = Domain::parse(
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n",
        Path::new("bench.yaml"),
    )
    .expect("the bench's config");
    let mut config = Config::default();
    config.add(domain).expect("one domain");
    let options = Options {
        max_descriptors: 100_000,
        ..Options::default()
    };
    Service::new(config, AnyStore::Memory(MemoryStore::new()), options)
}

fn request(descriptors: usize) -> CheckRequest {
    CheckRequest {
        domain: "bench".to_owned(),
        descriptors: (0..descriptors)
            .map(|index| Descriptor::entries(vec![("user".to_owned(), format!("u{index}"))]))
            .collect(),
        cost: None,
    }
}

fn descriptors(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let service = service();
    let mut group = c.benchmark_group("should_rate_limit");
    group.sample_size(20);
    for count in [10, 100, 1_000, 10_000] {
        let request = request(count);
        group.throughput(Throughput::Elements(count as u64));
        group.bench_with_input(BenchmarkId::from_parameter(count), &request, |b, request| {
            b.iter(|| runtime.block_on(service.should_rate_limit(request)).expect("decided"));
        });
    }
    group.finish();
}

// What `criterion_group!` and `criterion_main!` expand to, without the
// undocumented `pub fn` the first one generates.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    descriptors(&mut criterion);
    criterion.final_summary();
}
