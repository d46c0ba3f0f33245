"""The product every demo order buys, with stock to reserve."""

from django.db import migrations


def add_products(apps, schema_editor):
    Product = apps.get_model("shop", "Product")
    Product.objects.using(schema_editor.connection.alias).get_or_create(
        sku="preview-credits", defaults={"name": "Preview build credits", "stock": 1000}
    )


class Migration(migrations.Migration):
    dependencies = [("shop", "0001_initial")]

    operations = [migrations.RunPython(add_products, migrations.RunPython.noop)]
