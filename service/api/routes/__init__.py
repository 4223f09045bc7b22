"""One router per endpoint family; each handler validates, calls one operation, returns."""
