//! Tenants and their SLO classes: API key → tenant → default objectives, priority and
//! fallback. Header objectives are honoured only within what the tenant may ask for.

use std::{collections::HashMap, sync::Arc};

use arc_swap::ArcSwap;
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
    /// What the admission gate holds it to (weight, rates, concurrency).
    pub limits: headroom_core::admission::TenantLimits,
    /// Streams may fail over mid-stream (`proxy/failover.rs`).
    pub failover: bool,
}

/// One generation of the tenant table (swapped whole on reload).
#[derive(Debug)]
struct Table {
    by_key: HashMap<String, Arc<TenantConfig>>,
    /// Who serves requests without a known key; `None`: they get 401.
    anonymous: Option<Arc<TenantConfig>>,
}

/// API key → tenant. Reloadable: a reload swaps the whole table, so a request sees
/// one generation, and requests already admitted (streams) keep what they resolved.
#[derive(Debug)]
pub struct Tenants {
    table: ArcSwap<Table>,
}

/// Why a request has no tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyProblem {
    Missing,
    Malformed,
    Unknown,
}

impl Table {
    fn build(cfgs: &[TenantConfig], anonymous: Option<&str>) -> Self {
        let mut by_key = HashMap::new();
        let mut by_name: HashMap<&str, Arc<TenantConfig>> = HashMap::new();
        for c in cfgs {
            let t = Arc::new(c.clone());
            by_name.entry(c.name.as_str()).or_insert_with(|| t.clone());
            for k in &t.api_keys {
                by_key.insert(k.clone(), t.clone());
            }
        }
        let named = |name: &str| {
            by_name
                .get(name)
                .cloned()
                .unwrap_or_else(|| Arc::new(TenantConfig::default_tenant()))
        };
        // Without keys there is no identity to check: everyone is the default tenant.
        let anonymous = match anonymous {
            Some(a) => Some(named(a)),
            None if by_key.is_empty() => Some(named("default")),
            None => None,
        };
        Self { by_key, anonymous }
    }
}

impl Tenants {
    /// A table where requests without a known key go to the tenant named `default`
    /// (or a built-in one) when no tenant has keys, and are refused (401) otherwise.
    pub fn new(cfgs: &[TenantConfig]) -> Self {
        Self::with_anonymous(cfgs, None)
    }

    /// As [`Tenants::new`], with `anonymous` naming the tenant for requests without a
    /// known key even when tenants have keys.
    pub fn with_anonymous(cfgs: &[TenantConfig], anonymous: Option<&str>) -> Self {
        Self {
            table: ArcSwap::from_pointee(Table::build(cfgs, anonymous)),
        }
    }

    /// From the node's configuration (`tenants`, `edge.anonymous_tenant`).
    pub fn from_config(cfg: &crate::config::RouterConfig) -> Self {
        Self::with_anonymous(&cfg.tenants, cfg.edge.anonymous_tenant.as_deref())
    }

    /// Replaces the table; requests already resolved keep their tenant.
    pub fn reload(&self, cfgs: &[TenantConfig], anonymous: Option<&str>) {
        self.table.store(Arc::new(Table::build(cfgs, anonymous)));
    }

    /// Swaps in the table of `cfg` (`tenants`, `edge.anonymous_tenant`); returns the
    /// number of API keys now known.
    pub fn reload_from(&self, cfg: &crate::config::RouterConfig) -> usize {
        self.reload(&cfg.tenants, cfg.edge.anonymous_tenant.as_deref());
        self.key_count()
    }

    /// Number of API keys known (for logs after a reload).
    pub fn key_count(&self) -> usize {
        self.table.load().by_key.len()
    }

    fn api_key(headers: &HeaderMap) -> Result<&str, KeyProblem> {
        if let Some(v) = headers.get(http::header::AUTHORIZATION) {
            let v = v.to_str().map_err(|_| KeyProblem::Malformed)?;
            let (scheme, key) = v.trim().split_once(' ').ok_or(KeyProblem::Malformed)?;
            let key = key.trim();
            if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() {
                return Err(KeyProblem::Malformed);
            }
            return Ok(key);
        }
        match headers.get("x-api-key") {
            Some(v) => match v.to_str().map(str::trim) {
                Ok(k) if !k.is_empty() => Ok(k),
                _ => Err(KeyProblem::Malformed),
            },
            None => Err(KeyProblem::Missing),
        }
    }

    /// Resolves the tenant and its objectives for a request.
    pub fn resolve(&self, headers: &HeaderMap) -> Result<TenantClass, ApiError> {
        let table = self.table.load();
        let found = Self::api_key(headers)
            .and_then(|k| table.by_key.get(k).ok_or(KeyProblem::Unknown))
            .map(Arc::clone);
        let t = match (found, &table.anonymous) {
            (Ok(t), _) => t,
            (Err(_), Some(anon)) => anon.clone(),
            (Err(why), None) => {
                return Err(ApiError::new(
                    http::StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    match why {
                        KeyProblem::Missing => {
                            "Missing API key: send `Authorization: Bearer <key>`."
                        }
                        KeyProblem::Malformed => {
                            "Malformed API key: send `Authorization: Bearer <key>`."
                        }
                        KeyProblem::Unknown => "Incorrect API key provided.",
                    },
                ));
            }
        };
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
            limits: t.limits(),
            failover: t.failover,
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
            ..TenantConfig::default_tenant()
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
        // Keys are configured: an unknown, missing or malformed key is refused.
        for bad in [
            &[("authorization", "Bearer other")][..],
            &[],
            &[("authorization", "k-gold")],
            &[("authorization", "Basic k-gold")],
            &[("authorization", "Bearer ")],
            &[("x-api-key", "")],
        ] {
            let e = t.resolve(&h(bad)).unwrap_err();
            assert_eq!(e.status, http::StatusCode::UNAUTHORIZED, "{bad:?}");
            assert_eq!(e.body()["error"]["type"], "authentication_error");
        }
        // The x-api-key form works too.
        assert_eq!(
            t.resolve(&h(&[("x-api-key", "k-gold")])).unwrap().name,
            "gold"
        );
    }

    #[test]
    fn anonymous_tenant_serves_requests_without_a_key() {
        let gold = tenants().table.load().by_key["k-gold"].as_ref().clone();
        let t = Tenants::with_anonymous(std::slice::from_ref(&gold), Some("default"));
        assert_eq!(t.resolve(&h(&[])).unwrap().name, "default");
        assert_eq!(
            t.resolve(&h(&[("authorization", "Bearer nope")]))
                .unwrap()
                .name,
            "default"
        );
        // Without any keys configured, everyone is the default tenant (as before).
        let open = Tenants::new(&[]);
        assert_eq!(
            open.resolve(&h(&[("authorization", "x")])).unwrap().name,
            "default"
        );
    }

    #[test]
    fn reload_swaps_keys() {
        let t = tenants();
        let mut gold = t.table.load().by_key["k-gold"].as_ref().clone();
        gold.api_keys = vec!["k-new".into()];
        t.reload(&[gold], None);
        assert!(
            t.resolve(&h(&[("authorization", "Bearer k-gold")]))
                .is_err()
        );
        assert_eq!(
            t.resolve(&h(&[("authorization", "Bearer k-new")]))
                .unwrap()
                .name,
            "gold"
        );
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
                ("authorization", "Bearer k-gold"),
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
            let e = t
                .resolve(&h(&[
                    ("authorization", "Bearer k-gold"),
                    ("x-slo-tpot-ms", v),
                ]))
                .unwrap_err();
            assert_eq!(e.status, http::StatusCode::BAD_REQUEST, "{v}");
        }
    }
}
