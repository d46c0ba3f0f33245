"""The demo shop's trigger source: Stripe tells us an order is paid.

``stripe-orders`` uses the ``manual`` provider: its endpoint is registered by hand in Stripe's
dashboard (the source's detail names the URL and events once it is enabled), and the signing
secret Stripe shows there (``whsec_…``) is stored in the encrypted credential store
(``django_leases.triggers.credentials.set_secret("stripe-orders", …)``). Deliveries are
verified as Stripe signs them (``Stripe-Signature``, with its replay tolerance).
"""

from demo_project.shop.workflows import PAID_EVENTS, WORKFLOW
from django_leases.triggers import StartWorkflow, webhook_source

stripe_orders = webhook_source(
    "stripe-orders",
    provider="manual",
    config={"signature": "stripe"},
    events={event: StartWorkflow(WORKFLOW, input="delivery") for event in PAID_EVENTS},
)
