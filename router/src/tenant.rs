//! Tenants and their SLO classes: API key → tenant → default objectives, priority and
//! fallback. Header objectives are honoured only within what the tenant may ask for.

use std::{collections::HashMap, sync::Arc};

use http::HeaderMap;

use crate::{
    config::{Fallback, TenantConfig},
    error::ApiError,
    policy::Slo,
};

/// Largest objective accepted from a header (one hour): anything above is nonsense.
const MAX_SLO_MS: f64 = 3_600_000.0;

pub const SLO_TTFT_HEADERS: [&str; 2] = ["x-llm-d-slo-ttft-ms", "x-slo-ttft-ms"];
pub const SLO_TPOT_HEADERS: [&str; 2] = ["x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"];

/// A tenant resolved for one request.
#[derive(Clone, Debug)]
pub struct TenantClass {
    pub name: String,
    pub slo: Slo,
    pub priority: i32,
    pub fallback: Fallback,
}

#[derive(Debug)]
pub struct Tenants {
    by_key: HashMap<String, Arc<TenantConfig>>,
    default: Arc<TenantConfig>,
}

impl Tenants {
    pub fn new(cfgs: &[TenantConfig]) -> Self {
        let default = cfgs
            .iter()
            .find(|t| t.name == "default")
            .cloned()
            .unwrap_or_else(TenantConfig::default_tenant);
        let mut by_key = HashMap::new();
        for t in cfgs {
            let t = Arc::new(t.clone());
            for k in &t.api_keys {
                by_key.insert(k.clone(), t.clone());
            }
        }
        Self {
            by_key,
            default: Arc::new(default),
        }
    }

    fn api_key(headers: &HeaderMap) -> Option<&str> {
        if let Some(v) = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        {
            return v.strip_prefix("Bearer ").map(str::trim);
        }
        headers.get("x-api-key").and_then(|v| v.to_str().ok())
    }

    /// Resolves the tenant and its objectives for a request.
    pub fn resolve(&self, headers: &HeaderMap) -> Result<TenantClass, ApiError> {
        let t = Self::api_key(headers)
            .and_then(|k| self.by_key.get(k))
            .unwrap_or(&self.default);
        let ttft = header_ms(headers, &SLO_TTFT_HEADERS)?;
        let tpot = header_ms(headers, &SLO_TPOT_HEADERS)?;
        Ok(TenantClass {
            name: t.name.clone(),
            slo: Slo {
                ttft_ms: ttft.map_or(t.slo_ttft_ms, |v| v.max(t.min_ttft_ms)),
                tpot_ms: tpot.map_or(t.slo_tpot_ms, |v| v.max(t.min_tpot_ms)),
            },
            priority: t.priority,
            fallback: t.fallback,
        })
    }
}

/// Reads the first present header of `names` as milliseconds; invalid → 400.
fn header_ms(headers: &HeaderMap, names: &[&'static str]) -> Result<Option<f64>, ApiError> {
    for name in names {
        let Some(v) = headers.get(*name) else {
            continue;
        };
        let parsed = v.to_str().ok().and_then(|s| s.trim().parse::<f64>().ok());
        return match parsed {
            Some(ms) if ms.is_finite() && ms > 0.0 && ms <= MAX_SLO_MS => Ok(Some(ms)),
            _ => Err(ApiError::bad_request(format!(
                "header `{name}` must be a number of milliseconds in (0, {MAX_SLO_MS}]"
            ))),
        };
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants() -> Tenants {
        Tenants::new(&[TenantConfig {
            name: "gold".into(),
            api_keys: vec!["k-gold".into()],
            slo_ttft_ms: 300.0,
            slo_tpot_ms: 30.0,
            min_ttft_ms: 100.0,
            min_tpot_ms: 10.0,
            priority: 5,
            fallback: Fallback::Reject,
        }])
    }

    fn h(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn api_key_selects_tenant_and_defaults() {
        let t = tenants();
        let g = t
            .resolve(&h(&[("authorization", "Bearer k-gold")]))
            .unwrap();
        assert_eq!(
            (g.name.as_str(), g.slo.ttft_ms, g.priority),
            ("gold", 300.0, 5)
        );
        let d = t.resolve(&h(&[("authorization", "Bearer other")])).unwrap();
        assert_eq!(d.name, "default");
    }

    #[test]
    fn headers_honoured_within_bounds() {
        let t = tenants();
        let g = t
            .resolve(&h(&[
                ("authorization", "Bearer k-gold"),
                ("x-slo-ttft-ms", "50"),
                ("x-slo-tpot-ms", "40"),
            ]))
            .unwrap();
        assert_eq!(g.slo.ttft_ms, 100.0, "clamped to the tenant's tightest");
        assert_eq!(g.slo.tpot_ms, 40.0);
        // The canonical llm-d name wins over the alias.
        let g = t
            .resolve(&h(&[
                ("x-llm-d-slo-ttft-ms", "900"),
                ("x-slo-ttft-ms", "700"),
            ]))
            .unwrap();
        assert_eq!(g.slo.ttft_ms, 900.0);
    }

    #[test]
    fn absurd_values_are_400() {
        let t = tenants();
        for v in ["-5", "abc", "NaN", "inf", "0", "1e12"] {
            let e = t.resolve(&h(&[("x-slo-tpot-ms", v)])).unwrap_err();
            assert_eq!(e.status, http::StatusCode::BAD_REQUEST, "{v}");
        }
    }
}
