"""The protocol every database implements: one mixin per concern, each written once for
every database, composed into one class.

A database's statements (``postgresql``, ``mysql``, ``sqlite``) are this class with that
database's differences in front: for each concern where it writes its own SQL, the
concern's mixin for that database, from the concern's module. A database overrides a
method only in its mixin for the concern that defines the method, so whoever reads one
concern reads all of it, for every database, in one module (the claim protocol: one
package, a module per database).
"""

from stalwart.db.claims import Claims
from stalwart.db.control import Control
from stalwart.db.counters import Counters
from stalwart.db.leases import Leases
from stalwart.db.processes import Processes
from stalwart.db.slots import Slots
from stalwart.db.uniqueness import Uniqueness
from stalwart.db.wakeups import Wakeups


class Statements(Claims, Wakeups, Uniqueness, Slots, Processes, Leases, Control, Counters):
    """Every statement Stalwart sends, as every database writes it; each database's class
    puts its own concern mixins in front (see ``statements_for``)."""
