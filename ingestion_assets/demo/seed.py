"""Create and seed the demo `shop` database, and simulate the activity of a live shop between syncs."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psycopg2

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS customers (
    id          bigint PRIMARY KEY,
    email       text NOT NULL,
    zip         text,                       -- leading zeros: '00501'
    country     char(2) NOT NULL,
    tier        text,                       -- nullable
    profile     jsonb,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS products (
    sku         text PRIMARY KEY,           -- '000042': text with leading zeros as the key
    name        text NOT NULL,
    price       numeric(12,2) NOT NULL,
    weight_kg   numeric(10,3),
    attributes  jsonb,
    updated_at  timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS orders (
    id           bigint PRIMARY KEY,
    customer_id  bigint NOT NULL,
    product_sku  text NOT NULL,
    quantity     integer NOT NULL,
    unit_price   numeric(12,2) NOT NULL,
    total        numeric(38,9) NOT NULL,
    discount     numeric(5,4),
    status       text NOT NULL,
    note         text,
    shipping_zip text,
    placed_at    timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    meta         jsonb
);
CREATE INDEX IF NOT EXISTS orders_updated_at_id ON orders (updated_at, id);
CREATE INDEX IF NOT EXISTS customers_updated_at_id ON customers (updated_at, id);
CREATE INDEX IF NOT EXISTS products_updated_at_sku ON products (updated_at, sku);
"""

# Rows come in groups sharing one updated_at (ties across slice boundaries), microsecond precision.
SEED_SQL = """
INSERT INTO customers
SELECT g, 'customer' || g || '@example.com', lpad((g * 7919 %% 99999)::text, 5, '0'),
       (ARRAY['US','DE','FR','BR','JP','IN'])[1 + g %% 6],
       CASE WHEN g %% 4 = 0 THEN NULL ELSE (ARRAY['bronze','silver','gold'])[1 + g %% 3] END,
       jsonb_build_object('newsletter', g %% 2 = 0, 'tags', jsonb_build_array('t' || g %% 5)),
       timestamptz '2023-01-01 00:00:00+00' + g * interval '37 seconds 123457 microseconds',
       timestamptz '2024-01-01 00:00:00+00' + (g / 10) * interval '1 second 1 microsecond'
FROM generate_series(1::bigint, %(customers)s) g ON CONFLICT DO NOTHING;

INSERT INTO products
SELECT lpad(g::text, 6, '0'), 'product ' || g, round((1 + g * 3.7 %% 500)::numeric, 2),
       CASE WHEN g %% 9 = 0 THEN NULL ELSE round((g %% 1000 / 7.0)::numeric, 3) END,
       jsonb_build_object('color', (ARRAY['red','green','blue'])[1 + g %% 3], 'size', g %% 40),
       timestamptz '2024-01-01 00:00:00+00' + (g / 25) * interval '1 minute'
FROM generate_series(1::bigint, %(products)s) g ON CONFLICT DO NOTHING;

INSERT INTO orders
SELECT g, 1 + g * 31 %% %(customers)s, lpad((1 + g * 13 %% %(products)s)::text, 6, '0'), 1 + g %% 5,
       round((1 + g * 3.7 %% 500)::numeric, 2),
       round(((1 + g %% 5) * (1 + g * 3.7 %% 500))::numeric, 2) + (g %% 1000) * 0.000000001,
       CASE WHEN g %% 3 = 0 THEN NULL ELSE (g %% 50) / 100.0 END,
       (ARRAY['placed','paid','shipped','delivered'])[1 + g %% 4],
       CASE WHEN g %% 10 = 0 THEN 'gift – ' || chr(127873) || ' for ' || g ELSE NULL END,
       lpad((g * 7919 %% 99999)::text, 5, '0'),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '3 seconds 7 microseconds',
       timestamptz '2024-01-01 00:00:00+00' + (g / 40) * interval '120 seconds 654321 microseconds',
       CASE WHEN g %% 7 = 0 THEN NULL ELSE jsonb_build_object('channel', (ARRAY['web','app','store'])[1 + g %% 3],
            'items', jsonb_build_array(jsonb_build_object('sku', lpad((g %% 97)::text, 6, '0'), 'qty', 1 + g %% 5))) END
FROM generate_series(1::bigint, %(orders)s) g ON CONFLICT DO NOTHING;
"""


@dataclass(frozen=True)
class ShopSize:
    orders: int = 1_000_000
    customers: int = 50_000
    products: int = 2_000


def seed_shop(url: str, size: ShopSize = ShopSize()) -> None:
    """Create the tables and fill them if they are empty (idempotent)."""
    with contextlib.closing(psycopg2.connect(url)) as conn, conn.cursor() as cur:
        cur.execute(SCHEMA_SQL)
        cur.execute("SELECT count(*) FROM orders")
        (existing,) = cur.fetchone() or (0,)
        if existing == 0:
            cur.execute(SEED_SQL, {"orders": size.orders, "customers": size.customers, "products": size.products})
        conn.commit()
        conn.autocommit = True
        cur.execute("ANALYZE")


def simulate_activity(url: str, updates: int = 20_000, inserts: int = 5_000) -> None:
    """What happens in a live shop between two syncs: new orders, status changes, price changes.

    Each statement stamps all its rows with its start time, so thousands of rows tie on updated_at.
    """
    with contextlib.closing(psycopg2.connect(url)) as conn, conn.cursor() as cur:
        cur.execute(
            """
            UPDATE orders SET status = 'refunded', note = coalesce(note, '') || ' refunded',
                              updated_at = statement_timestamp()
            WHERE id IN (SELECT id FROM orders ORDER BY random() LIMIT %s)
            """,
            (updates,),
        )
        cur.execute(
            """
            INSERT INTO orders
            SELECT m + g, 1 + g %% 1000, '000001', 1, 9.99, 9.990000001, NULL, 'placed', NULL, '00501',
                   statement_timestamp(), statement_timestamp(), '{"channel": "app"}'
            FROM (SELECT coalesce(max(id), 0) AS m FROM orders) base, generate_series(1, %s) g
            """,
            (inserts,),
        )
        cur.execute(
            "UPDATE products SET price = price + 1, updated_at = statement_timestamp() "
            "WHERE sku IN (SELECT sku FROM products ORDER BY random() LIMIT 50)"
        )
        cur.execute(
            "UPDATE customers SET tier = 'gold', updated_at = statement_timestamp() "
            "WHERE id IN (SELECT id FROM customers ORDER BY random() LIMIT 500)"
        )
        conn.commit()
