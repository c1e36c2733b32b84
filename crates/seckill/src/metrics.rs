//! Prometheus metrics of one service instance, in a registry of its own.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// The service's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// HTTP requests by route and outcome (`code` of the JSON error, or `ok`).
    pub requests: IntCounterVec,
    /// HTTP request latency by route, in seconds.
    pub latency: HistogramVec,
    /// Orders accepted but not yet stored (entries in the voucher streams).
    pub pipeline_lag: IntGauge,
    /// Orders stored by this instance's pipeline.
    pub orders_stored: IntCounter,
    /// Orders this instance dead-lettered.
    pub dead_letters: IntCounter,
    /// Sales whose Redis state this instance restored (`kind="restored"`)
    /// or repaired (`kind="repaired"`) from the database.
    pub sale_repairs: IntCounterVec,
    /// Orders paid through this instance.
    pub orders_paid: IntCounter,
    /// Orders whose unit this instance gave back, by `why`.
    pub orders_returned: IntCounterVec,
    /// Given-back units this instance put on sale again in Redis.
    pub units_taken_back: IntCounter,
    /// Orders refunded through this instance.
    pub orders_refunded: IntCounter,
    /// Orders redeemed at their shop through this instance.
    pub orders_redeemed: IntCounter,
}

impl Metrics {
    /// A fresh set, registered in a registry of its own.
    ///
    /// # Errors
    /// Only if metric definitions clash (a programming error).
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new_custom(Some("seckill".into()), None)?;
        let requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by route and outcome"),
            &["route", "outcome"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new("http_request_duration_seconds", "HTTP request latency").buckets(
                vec![
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                ],
            ),
            &["route"],
        )?;
        let pipeline_lag = IntGauge::new("pipeline_lag_orders", "accepted orders not yet stored")?;
        let orders_stored = IntCounter::new(
            "pipeline_orders_stored_total",
            "orders stored by this instance",
        )?;
        let dead_letters = IntCounter::new(
            "pipeline_dead_letters_total",
            "orders dead-lettered by this instance",
        )?;
        let sale_repairs = IntCounterVec::new(
            Opts::new(
                "sale_repairs_total",
                "sales whose Redis state was restored or repaired from the database",
            ),
            &["kind"],
        )?;
        let orders_paid =
            IntCounter::new("orders_paid_total", "orders paid through this instance")?;
        let orders_returned = IntCounterVec::new(
            Opts::new(
                "orders_returned_total",
                "orders whose unit this instance gave back, by why (cancelled, expired, refunded)",
            ),
            &["why"],
        )?;
        let units_taken_back = IntCounter::new(
            "units_taken_back_total",
            "given-back units this instance put on sale again in Redis",
        )?;
        let orders_refunded = IntCounter::new(
            "orders_refunded_total",
            "orders refunded through this instance",
        )?;
        let orders_redeemed = IntCounter::new(
            "orders_redeemed_total",
            "orders redeemed at their shop through this instance",
        )?;
        registry.register(Box::new(orders_refunded.clone()))?;
        registry.register(Box::new(orders_redeemed.clone()))?;
        registry.register(Box::new(orders_paid.clone()))?;
        registry.register(Box::new(orders_returned.clone()))?;
        registry.register(Box::new(units_taken_back.clone()))?;
        registry.register(Box::new(sale_repairs.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(pipeline_lag.clone()))?;
        registry.register(Box::new(orders_stored.clone()))?;
        registry.register(Box::new(dead_letters.clone()))?;
        Ok(Self {
            registry,
            requests,
            latency,
            pipeline_lag,
            orders_stored,
            dead_letters,
            sale_repairs,
            orders_paid,
            orders_returned,
            units_taken_back,
            orders_refunded,
            orders_redeemed,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}
