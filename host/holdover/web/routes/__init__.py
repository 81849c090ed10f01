"""One router per resource; web/app.py includes them all."""
