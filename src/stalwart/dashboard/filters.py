"""The filters of a list of jobs, as a form: read from the query string, checked, and
turned into a ``JobFilter`` (to list) or a ``Selection`` (to act on everything that
matches)."""

from typing import Any
from urllib.parse import urlencode

from django import forms

from stalwart import browsing
from stalwart.control import Selection
from stalwart.queues import validate_queue_name

_TIME = {"type": "datetime-local", "step": "1"}


class FilterForm(forms.Form):
    id = forms.UUIDField(required=False, label="Job id")
    task = forms.CharField(required=False, max_length=255, label="Task")
    queue = forms.CharField(required=False, max_length=64, label="Queue")
    priority = forms.IntegerField(required=False, min_value=-100, max_value=100)
    since = forms.DateTimeField(
        required=False,
        label="From",
        widget=forms.DateTimeInput(attrs=_TIME, format="%Y-%m-%dT%H:%M:%S"),
    )
    until = forms.DateTimeField(
        required=False,
        label="Until",
        widget=forms.DateTimeInput(attrs=_TIME, format="%Y-%m-%dT%H:%M:%S"),
    )

    def clean_queue(self) -> str:
        queue = self.cleaned_data["queue"].strip()
        if queue:
            try:
                validate_queue_name(queue)
            except ValueError as error:
                raise forms.ValidationError(str(error)) from None
        return queue

    def searched_id(self) -> Any:
        return self.cleaned_data.get("id")

    def job_filter(self, state: str | None) -> browsing.JobFilter:
        data = self.cleaned_data
        return browsing.JobFilter(
            state=state,
            task=data.get("task") or None,
            queue=data.get("queue") or None,
            priority=data.get("priority"),
            since=data.get("since"),
            until=data.get("until"),
        )

    def query_string(self) -> str:
        """The filters (not the id searched), to carry into links and forms."""
        if not self.is_bound or not self.is_valid():
            return ""
        values = {
            name: self.data.get(name)
            for name in ("task", "queue", "priority", "since", "until")
            if self.data.get(name)
        }
        return urlencode(values)

    def selection(self, state: str, ids: list[Any]) -> Any:
        """Everything the filters match in ``state`` (or only ``ids``), as a Selection."""
        where = self.job_filter(state)
        return Selection(
            ids=ids,
            task_path=where.task,
            queue_name=where.queue,
            everything=not ids,
            priority=where.priority,
            time_column=where.time_field,
            since=where.since,
            until=where.until,
            state=state,
        )
