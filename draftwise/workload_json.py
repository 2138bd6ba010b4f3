"""The ``json`` benchmark workload: 16 described records to return as JSON, each with its schema.

``load_json()`` gives one chat prompt per record; ``BenchPrompt.schema`` is the JSON schema its
answer must follow (every listed key required, no others, strings bounded), which the benchmark
passes as ``StructuredOutputsParams(json=schema)`` when it constrains outputs. A field's type is
``str``/``int``/``float``/``bool`` or a one-element list for an array of that type.
"""
from __future__ import annotations

_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
MAX_STRING = 80  # characters: keeps a wandering answer bounded
MAX_ITEMS = 6

RECORDS = (
    ("a book", "title 'The Silent River', author Maria Lindqvist, published 2019, 312 pages, genres mystery and "
     "thriller, ISBN 978-0-14-312854-0",
     {"title": str, "author": str, "published": int, "pages": int, "genres": [str], "isbn": str}),
    ("an employee", "name John Okafor, id 4471, department Finance, started 3 March 2021, salary 58000 EUR, skills "
     "Excel, SQL and forecasting",
     {"name": str, "id": int, "department": str, "start_date": str, "salary_eur": int, "skills": [str]}),
    ("a product", "SKU KB-201, wireless keyboard, price 49.99 USD, in stock (120 units), colours black and white, "
     "weight 540 g",
     {"sku": str, "name": str, "price_usd": float, "in_stock": bool, "units": int, "colours": [str],
      "weight_g": int}),
    ("a weather report", "city Oslo, date 2024-01-15, temperature -7.5 C, humidity 81%, wind 12 km/h from the "
     "north, light snow",
     {"city": str, "date": str, "temperature_c": float, "humidity_percent": int, "wind_kmh": int,
      "wind_direction": str, "conditions": str}),
    ("a flight", "flight LH 455 from Frankfurt (FRA) to San Francisco (SFO), departs 2024-06-02 10:15, arrives "
     "13:05 local time, Airbus A350, gate B44",
     {"flight": str, "origin": str, "destination": str, "departure": str, "arrival": str, "aircraft": str,
      "gate": str}),
    ("a recipe", "pancakes for 4 people: 200 g flour, 2 eggs, 300 ml milk, a pinch of salt; 20 minutes; "
     "difficulty easy",
     {"name": str, "servings": int, "ingredients": [str], "minutes": int, "difficulty": str}),
    ("a customer order", "order 90312 by Aiko Tanaka, two notebooks at 3.50 and one pen at 1.20, shipping to "
     "Kyoto, paid by card, status shipped",
     {"order_id": int, "customer": str, "items": [str], "total": float, "shipping_city": str,
      "payment": str, "status": str}),
    ("a movie", "'Northern Lights', directed by Sam Reyes, 2021, 118 minutes, rated PG-13, starring Ana Costa "
     "and Lee Min, rating 7.4/10",
     {"title": str, "director": str, "year": int, "minutes": int, "rating_code": str, "cast": [str],
      "rating": float}),
    ("a server", "hostname web-03, IP 10.0.4.17, 8 CPU cores, 32 GB RAM, Ubuntu 22.04, services nginx and redis, "
     "last reboot 2024-05-30",
     {"hostname": str, "ip": str, "cpu_cores": int, "ram_gb": int, "os": str, "services": [str],
      "last_reboot": str}),
    ("a student", "Lena Fischer, student number 20231187, computer science, year 2, grades: algorithms A, "
     "databases B+, statistics A-",
     {"name": str, "student_number": int, "programme": str, "year": int, "grades": [str]}),
    ("a hotel booking", "guest Omar Haddad, Hotel Miramar, room 512 (double), check-in 2024-08-10, check-out "
     "2024-08-14, breakfast included, total 640 EUR",
     {"guest": str, "hotel": str, "room": int, "room_type": str, "check_in": str, "check_out": str,
      "breakfast": bool, "total_eur": int}),
    ("a car", "2018 Toyota Corolla, petrol, 85000 km, manual gearbox, colour silver, two previous owners, price "
     "11900 EUR",
     {"year": int, "make": str, "model": str, "fuel": str, "mileage_km": int, "gearbox": str, "colour": str,
      "previous_owners": int, "price_eur": int}),
    ("an event", "'Open Source Summit', Vienna, 12-14 September 2024, 1500 attendees expected, tracks cloud, "
     "security and AI, ticket 350 EUR",
     {"name": str, "city": str, "dates": str, "attendees": int, "tracks": [str], "ticket_eur": int}),
    ("a bank transaction", "id TX-778812, 2024-03-21 14:02 UTC, 250.00 GBP from account 12-34-56 to 65-43-21, "
     "reference 'rent March', status completed",
     {"id": str, "timestamp": str, "amount": float, "currency": str, "from_account": str, "to_account": str,
      "reference": str, "status": str}),
    ("a plant", "Monstera deliciosa, common name Swiss cheese plant, indirect light, water weekly, toxic to pets, "
     "grows up to 3 m indoors",
     {"species": str, "common_name": str, "light": str, "watering": str, "toxic_to_pets": bool,
      "max_height_m": float}),
    ("a support ticket", "ticket 5521 opened by p.nguyen@example.com, priority high, 'cannot log in after password "
     "reset', assigned to Maya, status open, tags login and auth",
     {"ticket_id": int, "opened_by": str, "priority": str, "summary": str, "assignee": str, "status": str,
      "tags": [str]}),
)


def schema(fields: dict) -> dict:
    """The JSON schema of a record: every key required, no other keys, strings and arrays bounded."""
    return {"type": "object", "properties": {key: _property(kind) for key, kind in fields.items()},
            "required": list(fields), "additionalProperties": False}


def _property(kind) -> dict:
    if isinstance(kind, list):
        return {"type": "array", "items": _property(kind[0]), "maxItems": MAX_ITEMS}
    out = {"type": _TYPES[kind]}
    if kind is str:
        out["maxLength"] = MAX_STRING
    return out


def prompt_text(kind: str, record: str) -> str:
    return (f"Produce a JSON object describing {kind}: {record}. Use snake_case keys, numbers as numbers and lists "
            "where there are several values. Reply with only the JSON.")
