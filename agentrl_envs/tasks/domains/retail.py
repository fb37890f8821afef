"""Retail: customers and their orders across regions."""

from agentrl_envs.tasks.domains.base import Domain

RETAIL = Domain(
    name="retail",
    fact="orders",
    fact_noun="order",
    entity="customers",
    entity_noun="customer",
    entity_key="customer_id",
    category="category",
    category_noun="product category",
    categories=("electronics", "grocery", "apparel", "toys", "garden", "books"),
    unit="region",
    unit_noun="region",
    units=("north", "south", "east", "west", "central"),
    date="order_date",
    measure="amount",
    measure_noun="order amount",
    count="quantity",
    count_noun="units",
    mail_domain="retail.example",
    scale=80.0,
)
