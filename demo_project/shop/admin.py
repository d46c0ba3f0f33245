from django.contrib import admin

from demo_project.shop.models import Order, Product, Receipt, Reservation


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("sku", "name", "stock")


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Order)
class OrderAdmin(ReadOnly):
    list_display = ("created_at", "payment", "event", "amount", "currency", "email", "status")
    list_filter = ("status", "event")
    search_fields = ("payment", "email")


@admin.register(Reservation)
class ReservationAdmin(ReadOnly):
    list_display = ("created_at", "order", "product", "quantity")


@admin.register(Receipt)
class ReceiptAdmin(ReadOnly):
    list_display = ("sent_at", "number", "email", "order")
