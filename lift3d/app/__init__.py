"""The web app (``lift3d app``): recipes table, uploads, a job queue of ``lift3d train`` subprocesses, and the page.

Only ``lift3d.app.ui`` imports gradio; the rest is plain Python so it is tested without a browser.
"""
