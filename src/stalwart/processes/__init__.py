"""The long-running roles: worker, dispatcher, scheduler, and the supervisor that forks them."""
