"""The service split over processes (``workers`` > 1): front-ends that parse and decode, one engine.

``supervisor`` starts and stops them, ``frontend`` relays requests and decodes their images
(``predecode``), ``engine`` runs the application on a private unix socket, and ``wire`` is what
crosses between them besides plain HTTP.
"""
