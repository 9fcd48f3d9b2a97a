print('Now run this command:')
print()
print('echo', 18 * 59, '> answer.txt')
