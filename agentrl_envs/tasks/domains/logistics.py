"""Logistics: clients and shipments across hubs. The held-out domain: never used in train or test."""

from agentrl_envs.tasks.domains.base import Domain

LOGISTICS = Domain(
    name="logistics",
    fact="shipments",
    fact_noun="shipment",
    entity="clients",
    entity_noun="client",
    entity_key="client_id",
    category="mode",
    category_noun="transport mode",
    categories=("air", "sea", "rail", "road", "courier"),
    unit="hub",
    unit_noun="hub",
    units=("rotterdam", "singapore", "memphis", "dubai"),
    date="ship_date",
    measure="cost",
    measure_noun="shipping cost",
    count="weight_kg",
    count_noun="kilograms",
    mail_domain="freight.example",
    scale=400.0,
)
