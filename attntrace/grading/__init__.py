"""Checking a student's hand calculation: answers, the mistake catalogue, the checker."""
