"""HR: employees and payroll runs across departments."""

from agentrl_envs.tasks.domains.base import Domain

HR = Domain(
    name="hr",
    fact="payroll",
    fact_noun="payroll entry",
    entity="employees",
    entity_noun="employee",
    entity_key="employee_id",
    category="pay_type",
    category_noun="pay type",
    categories=("salary", "overtime", "bonus", "commission", "allowance"),
    unit="department",
    unit_noun="department",
    units=("engineering", "sales", "support", "finance", "legal"),
    date="pay_date",
    measure="gross",
    measure_noun="gross pay",
    count="hours",
    count_noun="hours",
    mail_domain="people.example",
    scale=900.0,
    company="the HR department of a software company",
)
