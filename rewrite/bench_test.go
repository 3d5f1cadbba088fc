package rewrite

import "testing"

// benchNoHit is a realistic ~1 KB ORM-style query with nothing to find:
// snake_case columns, a CTE, joins, a string and a comment.
const benchNoHit = `/* app=api route=GET /v1/orders */
WITH recent_orders AS (
    SELECT o.id, o.customer_id, o.created_at, o.total_amount_cents, o.currency_code,
           o.shipping_address_id, o.billing_address_id, o.status, o.updated_at
    FROM orders o
    WHERE o.created_at >= now() - interval '30 days'
      AND o.status IN ('paid', 'shipped', 'delivered')
      AND o.deleted_at IS NULL
)
SELECT r.id, r.created_at, r.total_amount_cents, r.currency_code, r.status,
       c.id AS customer_id, c.email, c.first_name, c.last_name, c.phone_number,
       a.line_one, a.line_two, a.city, a.region, a.postal_code, a.country_code,
       count(li.id) AS line_item_count, sum(li.quantity) AS total_quantity,
       coalesce(max(s.shipped_at), r.updated_at) AS last_activity_at
FROM recent_orders r
JOIN customers c ON c.id = r.customer_id
LEFT JOIN addresses a ON a.id = r.shipping_address_id
LEFT JOIN line_items li ON li.order_id = r.id
LEFT JOIN shipments s ON s.order_id = r.id AND s.carrier_code = $3
WHERE c.tenant_id = $1 AND (c.email ILIKE $2 OR c.last_name ILIKE $2)
GROUP BY r.id, r.created_at, r.total_amount_cents, r.currency_code, r.status, r.updated_at,
         c.id, c.email, c.first_name, c.last_name, c.phone_number,
         a.line_one, a.line_two, a.city, a.region, a.postal_code, a.country_code
ORDER BY r.created_at DESC, r.id DESC
LIMIT 50 OFFSET $4`

const benchHit = `SELECT j.id, j.payload FROM jobs j
WHERE j.queue = $1 AND j.run_at <= now() AND pg_try_advisory_lock(hashtext(j.queue), j.id)
ORDER BY j.priority DESC, j.id LIMIT 1`

// benchNoHitCalls is a ~1.4 KB reporting query with nothing to find but many
// function calls, several with long names ending in the letters the call
// check looks at (s, y, t, e, l, d, k, g, w).
const benchNoHitCalls = `SELECT date_trunc('day', e.created_at) AS day, e.account_id,
       count(DISTINCT e.session_id) AS sessions, jsonb_agg(DISTINCT e.kind) AS kinds,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY e.duration_ms) AS p95,
       array_length(array_remove(array_agg(e.tag), NULL), 1) AS tag_count,
       jsonb_array_elements(e.payload -> 'items') AS items,
       regexp_matches(e.path, '^/v1/([a-z]+)') AS resource_matches,
       generate_series(1, 3) AS series, json_build_object('a', 1, 'b', 2) AS object,
       to_timestamp(e.epoch_seconds) AS happened_at, make_interval(days => 1) AS one_day,
       extract_tenant_settings(e.account_id) AS tenant_settings,
       coalesce(nullif(trim(e.referrer), ''), 'direct') AS referrer,
       lower(e.email_address) AS email_address, round(avg(e.amount_cents)::numeric, 2) AS average_amount,
       string_agg(DISTINCT e.country_code, ',' ORDER BY e.country_code) AS countries,
       row_number() OVER (PARTITION BY e.account_id ORDER BY e.created_at DESC) AS recency
FROM events e
JOIN accounts a ON a.id = e.account_id AND a.deleted_at IS NULL
WHERE e.created_at >= now() - make_interval(days => $1) AND e.account_id = ANY($2::bigint[])
  AND has_feature_flags(a.flags, 'reports') AND is_business_day(e.created_at::date)
GROUP BY date_trunc('day', e.created_at), e.account_id, e.payload, e.path, e.epoch_seconds
ORDER BY day DESC LIMIT 500`

func BenchmarkAnalyzeNoHit(b *testing.B) {
	b.SetBytes(int64(len(benchNoHit)))
	b.ReportAllocs()
	for b.Loop() {
		if Analyze(benchNoHit).Hit() {
			b.Fatal("hit")
		}
	}
}

func BenchmarkAnalyzeHit(b *testing.B) {
	b.SetBytes(int64(len(benchHit)))
	b.ReportAllocs()
	for b.Loop() {
		if !Analyze(benchHit).SessionAcquire {
			b.Fatal("no hit")
		}
	}
}

func BenchmarkAnalyzeNoHitFull(b *testing.B) {
	b.SetBytes(int64(len(benchNoHit)))
	b.ReportAllocs()
	for b.Loop() {
		_ = analyze(benchNoHit)
	}
}

func BenchmarkAnalyzeSetConfigLocal(b *testing.B) {
	q := "SELECT set_config('app.user_id', $1, true)"
	b.ReportAllocs()
	for b.Loop() {
		_ = Analyze(q)
	}
}

func BenchmarkAnalyzeLease(b *testing.B) {
	q := "SELECT lockpool.lease_acquire($1, $2, $3) AS token"
	b.ReportAllocs()
	for b.Loop() {
		if Analyze(q).Lease == nil {
			b.Fatal("no lease")
		}
	}
}

func BenchmarkAnalyzeNotify(b *testing.B) {
	q := "SELECT pg_notify($1, $2)"
	b.ReportAllocs()
	for b.Loop() {
		if len(Analyze(q).Notifies) != 1 {
			b.Fatal("no notify")
		}
	}
}

func BenchmarkAnalyzeListenNotify(b *testing.B) {
	q := "BEGIN; LISTEN jobs; NOTIFY jobs, 'x'; COMMIT"
	b.ReportAllocs()
	for b.Loop() {
		if len(Analyze(q).Notifies) != 1 {
			b.Fatal("no notify")
		}
	}
}

func BenchmarkAnalyzeNoHitCalls(b *testing.B) {
	b.SetBytes(int64(len(benchNoHitCalls)))
	b.ReportAllocs()
	for b.Loop() {
		if Analyze(benchNoHitCalls).Hit() {
			b.Fatal("hit")
		}
	}
}
