//! OpenTelemetry traces of each request's life, exported over OTLP/HTTP protobuf when
//! `[tracing] otlp_endpoint` is set (`span.rs` holds one request's spans).
//!
//! Invariants: with no endpoint the node holds no [`Traces`] and every hook is one
//! `Option` test — no exporter, no thread, no span, no allocation per request. With
//! one, finished spans go to the SDK's batch processor: a bounded queue
//! (`max_queued_spans`, excess dropped, never blocking a request) drained by its own
//! thread every `export_interval_ms`; each export runs on the router's tokio runtime
//! (the hyper client needs its reactor) and is cut at `export_timeout_ms`. A client's
//! `traceparent` is honoured: the router's spans join its trace, and its sampling
//! decision stands (parent-based; `sample_ratio` applies to new traces). Upstream
//! requests carry the router's own `traceparent`, so an engine that traces (vLLM
//! `--otlp-traces-endpoint`) continues the same trace.
//!
//! Cost when on (measured in `bench/PROXY_OVERHEAD.md`): five spans per streamed
//! request, ≈ 1 KB each until exported.

pub mod span;

use std::{sync::Arc, time::Duration};

use opentelemetry::{propagation::TextMapPropagator, trace::TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    error::{OTelSdkError, OTelSdkResult},
    propagation::TraceContextPropagator,
    trace::{
        BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData,
        SpanExporter,
    },
};

use crate::config::TracingConfig;

pub use span::RequestTrace;

/// The node's tracer, present only when an endpoint is configured.
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

pub use crate::config::url::traces_url;

impl Traces {
    /// The exporter and batch processor for `cfg`, or `None` when tracing is off. Must
    /// run inside the tokio runtime that will carry the exports.
    pub fn start(cfg: &TracingConfig) -> anyhow::Result<Option<Traces>> {
        let Some(endpoint) = &cfg.otlp_endpoint else {
            return Ok(None);
        };
        let url = traces_url(endpoint).map_err(anyhow::Error::msg)?;
        let timeout = Duration::from_millis(cfg.export_timeout_ms);
        let otlp = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.to_string())
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(timeout)
            .build()?;
        let exporter = OnRuntime {
            inner: Arc::new(otlp),
            rt: tokio::runtime::Handle::current(),
            timeout,
        };
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(cfg.max_queued_spans)
                    .with_max_export_batch_size(cfg.max_queued_spans.min(512))
                    .with_scheduled_delay(Duration::from_millis(cfg.export_interval_ms))
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_resource(
                Resource::builder()
                    .with_service_name(cfg.service_name.clone())
                    .build(),
            )
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                cfg.sample_ratio,
            ))))
            .with_span_processor(batch)
            .build();
        let tracer = provider.tracer("headroom");
        tracing::info!(endpoint = %url, "exporting request traces over OTLP/HTTP");
        Ok(Some(Traces {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
        }))
    }

    /// Sends what is queued and stops the export thread. Blocks (call it from
    /// `spawn_blocking` on a multi-threaded runtime: the exports run on it).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("trace exporter shutdown: {e}");
        }
    }

    pub(crate) fn propagator(&self) -> &dyn TextMapPropagator {
        &self.propagator
    }
}

/// Runs the OTLP exporter's future on the router's runtime: the batch processor calls
/// `export` from its own thread, where hyper would find no reactor.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    rt: tokio::runtime::Handle,
    timeout: Duration,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = self.inner.clone();
        let timeout = self.timeout;
        let task = self.rt.spawn(async move {
            tokio::time::timeout(timeout, inner.export(batch))
                .await
                .unwrap_or(Err(OTelSdkError::Timeout(timeout)))
        });
        task.await
            .unwrap_or_else(|e| Err(OTelSdkError::InternalFailure(e.to_string())))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called once while the provider is built, before the exporter is shared.
        if let Some(e) = Arc::get_mut(&mut self.inner) {
            e.set_resource(resource);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn endpoints_get_the_traces_path_and_only_http_is_taken() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap().to_string(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/").unwrap().to_string(),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/otlp/v1/traces")
                .unwrap()
                .to_string(),
            "http://c:4318/otlp/v1/traces"
        );
        assert!(traces_url("https://c:4318").unwrap_err().contains("https"));
        assert!(traces_url("c:4318").is_err());
        assert!(traces_url("not a url").is_err());
    }
}
