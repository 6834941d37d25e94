"""Leases: named, expiring rights to do a cluster-wide chore (one holder at a time)."""

from django.db import models


class Lease(models.Model):
    """Who may do the chore ``name`` until ``expires_at`` (database clock)."""

    name = models.CharField(max_length=128, primary_key=True)
    holder = models.CharField(max_length=128)
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "stalwart_lease"

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder} until {self.expires_at}"
