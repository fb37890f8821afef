"""Finance: accounts and their transactions across branches."""

from agentrl_envs.tasks.domains.base import Domain

FINANCE = Domain(
    name="finance",
    fact="transactions",
    fact_noun="transaction",
    entity="accounts",
    entity_noun="account holder",
    entity_key="account_id",
    category="tx_type",
    category_noun="transaction type",
    categories=("wire", "card", "ach", "check", "fx"),
    unit="branch",
    unit_noun="branch",
    units=("downtown", "harbor", "uptown", "airport"),
    date="tx_date",
    measure="amount",
    measure_noun="transaction amount",
    count="fee_bps",
    count_noun="fee basis points",
    mail_domain="bank.example",
    scale=1500.0,
    company="a retail bank",
)
