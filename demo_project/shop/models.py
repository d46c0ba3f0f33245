"""The demo shop's tables: products with stock, orders, stock reservations, receipts.

Every write the ``fulfil-order`` workflow makes is keyed by the order's payment (the Stripe
PaymentIntent id), so a step that runs again — or a second event about the same payment —
changes nothing: one order, one reservation, one receipt.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models, router, transaction
from django.db.models import F
from django.utils import timezone

#: The product every demo order buys (Stripe's fixtures carry no line items).
DEMO_SKU = "preview-credits"


class OutOfStockError(Exception):
    """Not enough stock to reserve an order's quantity."""


class OrderStatus(models.TextChoices):
    PAID = "paid", "paid"
    RESERVED = "reserved", "stock reserved"
    RECEIPTED = "receipted", "receipt sent"


class Product(models.Model):
    sku = models.CharField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    stock = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} ({self.stock} in stock)"


class OrderQuerySet(models.QuerySet["Order"]):
    def record_paid(self, payment: str, **values: Any) -> tuple[Order, bool]:
        """The order of ``payment`` (a Stripe PaymentIntent or Checkout Session id), created
        from ``values`` the first time; later calls return it unchanged. Returns ``(order,
        created)``."""
        alias = router.db_for_write(self.model)
        with transaction.atomic(using=alias):
            return self.using(alias).get_or_create(payment=payment, defaults=values)


class Order(models.Model):
    payment = models.CharField(max_length=255, unique=True, help_text="Stripe payment id")
    event = models.CharField(max_length=100, help_text="The Stripe event that reported it paid")
    sku = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField(default=1)
    amount = models.BigIntegerField(help_text="In the currency's smallest unit")
    currency = models.CharField(max_length=3)
    email = models.EmailField(blank=True)
    status = models.CharField(max_length=16, choices=OrderStatus.choices, default=OrderStatus.PAID)
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[OrderQuerySet] = OrderQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"order {self.payment} ({self.status})"


class ReservationQuerySet(models.QuerySet["Reservation"]):
    def reserve(self, order: Order) -> tuple[Reservation, bool]:
        """Reserve ``order.quantity`` of ``order.sku`` once: the stock goes down only when the
        reservation is created, in the same transaction. Returns ``(reservation, created)``.

        Raises ``OutOfStockError`` (nothing written) when the stock is short, and
        ``Product.DoesNotExist`` for an unknown SKU.
        """
        alias = router.db_for_write(self.model)
        with transaction.atomic(using=alias):
            existing = self.using(alias).filter(order=order).first()
            if existing is not None:
                return existing, False
            product = Product.objects.using(alias).select_for_update().get(sku=order.sku)
            taken = (
                Product.objects.using(alias)
                .filter(pk=product.pk, stock__gte=order.quantity)
                .update(stock=F("stock") - order.quantity)
            )
            if not taken:
                raise OutOfStockError(
                    f"{order.quantity} × {order.sku} wanted, {product.stock} in stock"
                )
            reservation = self.using(alias).create(
                order=order, product=product, quantity=order.quantity
            )
            Order.objects.using(alias).filter(pk=order.pk, status=OrderStatus.PAID).update(
                status=OrderStatus.RESERVED
            )
            return reservation, True


class Reservation(models.Model):
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="reservation")
    product = models.ForeignKey(Product, on_delete=models.PROTECT)
    quantity = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[ReservationQuerySet] = ReservationQuerySet.as_manager()  # type: ignore[assignment]

    def __str__(self) -> str:
        return f"{self.quantity} × {self.product.sku} for {self.order.payment}"


class ReceiptQuerySet(models.QuerySet["Receipt"]):
    def send_once(self, order: Order, body: str) -> tuple[Receipt, bool]:
        """Record the receipt of ``order`` as sent, once. Returns ``(receipt, created)``.

        The demo sends nothing; a real sender would pass ``receipt.number`` to its mail
        provider as the idempotency key, so a step that runs again never mails twice.
        """
        alias = router.db_for_write(self.model)
        with transaction.atomic(using=alias):
            receipt, created = self.using(alias).get_or_create(
                order=order,
                defaults={"number": f"R-{order.pk:06d}", "email": order.email, "body": body},
            )
            Order.objects.using(alias).filter(pk=order.pk).update(status=OrderStatus.RECEIPTED)
            return receipt, created


class Receipt(models.Model):
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="receipt")
    number = models.CharField(max_length=20, unique=True)
    email = models.EmailField(blank=True)
    body = models.TextField()
    sent_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[ReceiptQuerySet] = ReceiptQuerySet.as_manager()  # type: ignore[assignment]

    def __str__(self) -> str:
        return f"receipt {self.number}"
