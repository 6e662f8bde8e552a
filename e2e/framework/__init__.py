"""Helpers the e2e modules share (issue 36): a test module's functions are not another test module's API.

e2e/ is on sys.path (pytest inserts the directory of e2e/conftest.py), so these import as `framework.<module>`.
"""
