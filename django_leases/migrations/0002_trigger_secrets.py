from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_leases", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="TriggerSecret",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200, unique=True)),
                ("ciphertext", models.TextField()),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "ordering": ("name",),
            },
        ),
    ]
